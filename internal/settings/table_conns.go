package settings

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig"
)

// The groups of the settings table of the connections the service opens or
// accepts: Redis, TLS, the gRPC port, the xDS server, the trace exporter. table
// (table.go) puts them in their places among the others.

// redisSettings: the Redis of the counters, the per-second one, and the bounds of
// the store work (its timeout, the deny cache).
func redisSettings(s *Settings) []Setting {
	return []Setting{
		{Name: FlagRedisURL, bind: stringFlag(&s.RedisURL, ""), Group: groupRedis,
			Help: "standalone Redis: a redis://, rediss:// or unix:// URL; no Redis flag: an embedded store, one replica",
			Doc: "a standalone Redis: `redis://[user:password@]host:port[/db]`, `rediss://` for TLS, `unix:///path`; " +
				"or `host:port`, a socket path",
			Ref: []RefVar{
				{Name: "REDIS_SOCKET_TYPE", Default: "unix", Joint: true,
					Here: "tcp or unix; unset, a REDIS_URL starting with / is a Unix socket, any other TCP"},
				{Name: "REDIS_TYPE", Default: "SINGLE", Joint: true,
					Here: "SINGLE: --redis-url; CLUSTER: --redis-cluster-url; SENTINEL: --redis-sentinel-url"},
				{Name: "REDIS_URL", Default: "/var/run/nutcracker/ratelimit.sock", Joint: true,
					Here: "host:port, a socket path, or a redis:// URL; CLUSTER: host:port,host:port,...; " +
						"SENTINEL: master,host:port,host:port,...; required when any REDIS_* is set"},
				{Name: "REDIS_AUTH", Joint: true, Here: "password, or user:password, put into the Redis URL"},
				{Name: "REDIS_TLS", Default: "false", Joint: true, Here: "true: rediss:// (TLS to Redis, and to the Sentinels)"},
			}},
		{Name: FlagRedisClusterURL, bind: stringFlag(&s.RedisClusterURL, ""), Group: groupRedis,
			Help: "Redis Cluster seed nodes: redis://[user:password@]host:port?addr=host2:port&addr=host3:port",
			Doc:  "a Redis Cluster: seed nodes as `redis://[user:password@]host:port?addr=host2:port&addr=host3:port`"},
		{Name: FlagRedisSentinelURL, bind: stringFlag(&s.RedisSentinelURL, ""), Group: groupRedis,
			Help: "Redis Sentinel: redis://[user:password@]host:port?master_name=NAME&addr=host2:port (or rediss://)",
			Doc: "a Sentinel-managed master: `redis://[sentinel-user:sentinel-password@]host:port?master_name=NAME&addr=host2:port" +
				"[&username=U&password=P]` (`username`/`password` are the master's)",
			Ref: []RefVar{{Name: "REDIS_SENTINEL_AUTH", Joint: true, Here: "password, or user:password, of the Sentinels"}}},
		{Name: FlagRedisPerSecondURL, bind: stringFlag(&s.RedisPerSecondURL, ""), Group: groupRedisPerSecond,
			Help: "standalone Redis for the limits of a one-second window, as --redis-url; empty: on the main Redis",
			Doc: "a Redis of their own for the limits whose window is one second, as the reference's `REDIS_PERSECOND`, " +
				"in `--redis-url`'s forms; the `--redis-tls-*` files serve both. Needs a main Redis " +
				"(see [Stores](stores.md#a-redis-for-per-second-limits))",
			check: func() error {
				set := 0
				for _, u := range []string{s.RedisPerSecondURL, s.RedisPerSecondClusterURL, s.RedisPerSecondSentinelURL} {
					if u != "" {
						set++
					}
				}
				if set > 1 {
					return errors.New("give one of --redis-persecond-url, --redis-persecond-cluster-url and --redis-persecond-sentinel-url")
				}
				return nil
			},
			Ref: []RefVar{
				{Name: "REDIS_PERSECOND", Default: "false", Joint: true,
					Here: "true: the limits of unit second are counted on the Redis of REDIS_PERSECOND_*, read as REDIS_* are " +
						"(--redis-persecond-url, --redis-persecond-cluster-url, --redis-persecond-sentinel-url)"},
				{Name: "REDIS_PERSECOND_SOCKET_TYPE", Default: "unix", Joint: true, Here: "as REDIS_SOCKET_TYPE, with REDIS_PERSECOND=true"},
				{Name: "REDIS_PERSECOND_TYPE", Default: "SINGLE", Joint: true,
					Here: "SINGLE: --redis-persecond-url; CLUSTER: --redis-persecond-cluster-url; SENTINEL: --redis-persecond-sentinel-url"},
				{Name: "REDIS_PERSECOND_URL", Default: "/var/run/nutcracker/ratelimitpersecond.sock", Joint: true,
					Here: "as REDIS_URL; required with REDIS_PERSECOND=true"},
				{Name: "REDIS_PERSECOND_AUTH", Joint: true, Here: "as REDIS_AUTH, for the per-second Redis"},
				{Name: "REDIS_PERSECOND_TLS", Default: "false", Joint: true,
					Here: "true: rediss:// to the per-second Redis, with the REDIS_TLS_* files (as in the reference)"},
			}},
		{Name: FlagRedisPerSecondClusterURL, bind: stringFlag(&s.RedisPerSecondClusterURL, ""), Group: groupRedisPerSecond,
			Help: "Redis Cluster for the limits of a one-second window, as --redis-cluster-url",
			Doc:  "a Redis Cluster for the limits whose window is one second, as `--redis-cluster-url`"},
		{Name: FlagRedisPerSecondSentinelURL, bind: stringFlag(&s.RedisPerSecondSentinelURL, ""), Group: groupRedisPerSecond,
			Help: "Redis Sentinel master for the limits of a one-second window, as --redis-sentinel-url",
			Doc:  "a Sentinel-managed master for the limits whose window is one second, as `--redis-sentinel-url`",
			Ref: []RefVar{{Name: "REDIS_PERSECOND_SENTINEL_AUTH", Joint: true,
				Here: "as REDIS_SENTINEL_AUTH, for the per-second Redis's Sentinels"}}},
		{Name: "store-timeout", bind: durationFlag(&s.StoreTimeout, limiter.DefaultTimeout),
			Help: "upper bound of a request's store work, queueing included; past it the rule's failure_mode answers",
			Doc: "upper bound of a request's store work, queueing included; the caller's own deadline (Envoy's filter timeout, " +
				"20 ms by default) less a margin to answer normally ends it first. Past it, each rule's `failure_mode` answers " +
				"(see [Failure modes](../README.md#failure-modes))",
			check: func() error { return want(s.StoreTimeout > 0, s.StoreTimeout, "a duration above 0") }},
		{Name: "deny-cache", bind: durationFlag(&s.DenyCache, limiter.DefaultDenyCache),
			Help: "how long at most a denial Redis gave is repeated from memory for the same counter and cost; 0: off",
			Doc: "how long at most a denial Redis gave is repeated from memory, without a store call, for a hit on the same " +
				"counter with the same limit and the same cost; never past Redis's own wait, which stays the announced " +
				"`retry-after`. At most 16 MiB. `0` turns it off",
			check: func() error { return want(s.DenyCache >= 0, s.DenyCache, "a duration, 0 for off") },
			Ref: []RefVar{{Name: "LOCAL_CACHE_SIZE_IN_BYTES", Default: "0", Conv: convLocalCache,
				Here: "0: --deny-cache=0 (no local cache of denials); more: the deny cache stays on (--deny-cache), bounded by entries, not bytes"}}},
	}
}

// tlsSettings: TLS of the gRPC listeners, and to Redis.
func tlsSettings(s *Settings) []Setting {
	gt, rt := &s.GRPCTLS, &s.RedisTLS
	return []Setting{
		{Name: FlagGRPCTLSCert, bind: stringFlag(&gt.Cert, ""), Group: groupGRPCTLS,
			Help: "PEM certificate (chain) of the gRPC listeners: with --grpc-tls-key, TLS only (1.2 minimum); reloaded",
			Doc: "PEM certificate (chain): with `--grpc-tls-key`, the gRPC listeners serve TLS only (1.2 minimum). Reloaded when " +
				"the file changes",
			check: func() error {
				if (gt.Cert == "") != (gt.Key == "") {
					return errors.New("--grpc-tls-cert and --grpc-tls-key go together: set both or neither")
				}
				return nil
			},
			Ref: []RefVar{
				{Name: "GRPC_SERVER_USE_TLS", Default: "false", Joint: true, Here: "true: the gRPC listener serves TLS " +
					"(--grpc-tls-cert, --grpc-tls-key from GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY)"},
				{Name: "GRPC_SERVER_TLS_CERT", Joint: true,
					Here: "--grpc-tls-cert, when GRPC_SERVER_USE_TLS=true (reloaded on change, as the reference's)"},
			}},
		{Name: FlagGRPCTLSKey, bind: stringFlag(&gt.Key, ""), Group: groupGRPCTLS,
			Help: "PEM private key of --grpc-tls-cert; reloaded when the file changes",
			Doc:  "PEM private key of `--grpc-tls-cert`. Reloaded when the file changes",
			Ref:  []RefVar{{Name: "GRPC_SERVER_TLS_KEY", Joint: true, Here: "--grpc-tls-key, when GRPC_SERVER_USE_TLS=true"}}},
		{Name: FlagGRPCTLSClientCA, bind: stringFlag(&gt.ClientCA, ""), Group: groupGRPCTLS,
			Help: "PEM CA certificates: every gRPC client must present a certificate they signed (mutual TLS); reloaded",
			Doc:  "PEM CA certificates: every gRPC client must present a certificate they signed (mutual TLS). Reloaded when the file changes",
			check: func() error {
				if gt.ClientCA != "" && gt.Cert == "" {
					return errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
				}
				return nil
			},
			Ref: []RefVar{{Name: "GRPC_CLIENT_TLS_CACERT", Joint: true,
				Here: "--grpc-tls-client-ca (clients must present a certificate), when GRPC_SERVER_USE_TLS=true"}}},
		{Name: FlagGRPCTLSClientSAN, bind: stringFlag(&gt.ClientSAN, ""), Group: groupGRPCTLS,
			Help: "with --grpc-tls-client-ca: the name (DNS or IP SAN) a client certificate must hold",
			Doc:  "with `--grpc-tls-client-ca`: the name (DNS or IP SAN) a client certificate must hold",
			check: func() error {
				if gt.ClientSAN != "" && gt.ClientCA == "" {
					return errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca")
				}
				return nil
			},
			Ref: []RefVar{{Name: "GRPC_CLIENT_TLS_SAN", Joint: true, Here: "--grpc-tls-client-san, when GRPC_SERVER_USE_TLS=true"}}},
		{Name: FlagRedisTLSCA, bind: stringFlag(&rt.CA, ""), Group: groupRedis,
			Help: "PEM CA certificates for the Redis server's certificate, instead of the system roots (rediss:// only)",
			Doc:  "PEM CA for the Redis server's certificate instead of the system roots (`rediss://` only; read at start)",
			check: func() error {
				if *rt == (RedisTLS{}) {
					return nil
				}
				if !slices.ContainsFunc([]string{s.RedisURL, s.RedisClusterURL, s.RedisSentinelURL,
					s.RedisPerSecondURL, s.RedisPerSecondClusterURL, s.RedisPerSecondSentinelURL}, func(u string) bool {
					return strings.HasPrefix(u, "rediss://")
				}) {
					return errors.New("--redis-tls-* flags need a rediss:// --redis-url, --redis-cluster-url or --redis-sentinel-url " +
						"(or --redis-persecond-*)")
				}
				if (rt.Cert == "") != (rt.Key == "") {
					return errors.New("--redis-tls-cert and --redis-tls-key go together: set both or neither")
				}
				return nil
			},
			Ref: []RefVar{{Name: "REDIS_TLS_CACERT", Joint: true, Here: "--redis-tls-ca, when REDIS_TLS or REDIS_PERSECOND_TLS is true"}}},
		{Name: FlagRedisTLSCert, bind: stringFlag(&rt.Cert, ""), Group: groupRedis,
			Help: "PEM client certificate presented to Redis, with --redis-tls-key (rediss:// only); reloaded",
			Doc:  "client certificate for Redis's `tls-auth-clients`, with `--redis-tls-key` (`rediss://` only). Reloaded when the file changes",
			Ref:  []RefVar{{Name: "REDIS_TLS_CLIENT_CERT", Joint: true, Here: "--redis-tls-cert, when REDIS_TLS or REDIS_PERSECOND_TLS is true"}}},
		{Name: FlagRedisTLSKey, bind: stringFlag(&rt.Key, ""), Group: groupRedis,
			Help: "PEM private key of --redis-tls-cert; reloaded when the file changes",
			Doc:  "PEM private key of `--redis-tls-cert`. Reloaded when the file changes",
			Ref:  []RefVar{{Name: "REDIS_TLS_CLIENT_KEY", Joint: true, Here: "--redis-tls-key, when REDIS_TLS or REDIS_PERSECOND_TLS is true"}}},
		{Name: "redis-tls-server-name", bind: stringFlag(&rt.ServerName, ""),
			Help: "name the Redis server's certificate must hold, when not the --redis-url host (rediss:// only)",
			Doc:  "the name the Redis certificate must hold, when not the URL's host"},
		{Name: FlagRedisTLSSkipHostname, bind: boolFlag(&rt.SkipHostnameVerification, false), Group: groupRedis,
			Help: "verify the Redis server's certificate chain but not its name (rediss:// only)",
			Doc:  "verify the Redis certificate's chain, not its name",
			Ref: []RefVar{{Name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Default: "false", Joint: true,
				Here: "--redis-tls-skip-hostname-verification, when REDIS_TLS or REDIS_PERSECOND_TLS is true"}}},
	}
}

// grpcPortSettings: the gRPC port's connections and server.
func grpcPortSettings(s *Settings) []Setting {
	return []Setting{
		{Name: "grpc-max-connection-age", bind: durationFlag(&s.GRPCMaxConnAge, 24*time.Hour),
			Help:  "a gRPC connection this old (±10%) is asked to go away, so clients spread over new replicas; 0: never",
			Doc:   "a gRPC connection this old (±10%) is asked to go away, so Envoy spreads over new replicas. `0`: never",
			check: func() error { return want(s.GRPCMaxConnAge >= 0, s.GRPCMaxConnAge, "a duration, 0 for never") },
			Ref:   []RefVar{{Name: "GRPC_MAX_CONNECTION_AGE", Default: "24h", Conv: convDuration}}},
		{Name: "grpc-max-connection-age-grace", bind: durationFlag(&s.GRPCMaxConnAgeGrace, time.Hour),
			Help:  "how long calls may go on after --grpc-max-connection-age before the connection closes",
			Doc:   "then how long its calls may go on before it closes",
			check: func() error { return want(s.GRPCMaxConnAgeGrace >= 0, s.GRPCMaxConnAgeGrace, "a duration, 0 for none") },
			Ref:   []RefVar{{Name: "GRPC_MAX_CONNECTION_AGE_GRACE", Default: "1h", Conv: convDuration}}},
		{Name: "grpc-server", bind: stringFlag(&s.GRPCServer, GRPCServerLean),
			Help: "server of --grpc-addr: lean (this service's own HTTP/2 transport) or grpc-go (grpc-go's server)",
			Doc: "the server of `--grpc-addr`: `lean`, this service's own HTTP/2 transport (`internal/grpcunary`, less CPU per " +
				"call), or `grpc-go`, grpc-go's server with the same services, interceptors, limits and TLS. An escape hatch: " +
				"see [Choosing the gRPC server](reliability.md#choosing-the-grpc-server)",
			check: func() error {
				return want(s.GRPCServer == GRPCServerLean || s.GRPCServer == GRPCServerGRPCGo, s.GRPCServer,
					GRPCServerLean+" or "+GRPCServerGRPCGo)
			}},
	}
}

// overXDS is check when the config comes over xDS, and no check otherwise:
// the xDS settings matter only then.
func overXDS(x *XDS, check func() error) func() error {
	return func() error {
		if x.ConfigType != ConfigTypeXDS {
			return nil
		}
		return check()
	}
}

// xdsSettings: where the config comes from, and the xDS server: its address,
// what this service says it is, TLS.
func xdsSettings(s *Settings) []Setting {
	x := &s.XDS
	return []Setting{
		{Name: "config-type", bind: stringFlag(&x.ConfigType, ConfigTypeFile),
			Help: "where the config comes from: FILE (--config) or GRPC_XDS_SOTW (an xDS server, --xds-server-url)",
			Doc: "where the config comes from: `FILE` (`--config`) or `GRPC_XDS_SOTW`, an xDS server " +
				"(see [Config over xDS](xds.md))",
			check: func() error {
				if x.ConfigType != ConfigTypeFile && x.ConfigType != ConfigTypeXDS {
					return fmt.Errorf("--config-type: %q is not %s or %s", x.ConfigType, ConfigTypeFile, ConfigTypeXDS)
				}
				return nil
			},
			Ref: []RefVar{{Name: "CONFIG_TYPE", Default: "FILE"}}},
		{Name: "xds-server-url", bind: stringFlag(&x.ServerURL, "localhost:18000"),
			Help: "host:port of the xDS server that serves RateLimitConfig resources",
			Doc:  "`host:port` of the xDS server serving `RateLimitConfig` resources",
			Ref:  []RefVar{{Name: "CONFIG_GRPC_XDS_SERVER_URL", Default: "localhost:18000"}}},
		{Name: "xds-node-id", bind: stringFlag(&x.NodeID, "default"),
			Help: "node id this service subscribes as; the server picks the config by it",
			Doc:  "node id this service subscribes as; the server picks the config by it (Envoy Gateway: `envoy-ratelimit`)",
			check: overXDS(x, func() error {
				if x.NodeID == "" {
					return errors.New("--xds-node-id is empty")
				}
				return nil
			}),
			Ref: []RefVar{{Name: "CONFIG_GRPC_XDS_NODE_ID", Default: "default"}}},
		{Name: FlagXDSNodeMetadata, bind: stringFlag(&x.NodeMetadata, ""),
			Help:  "node metadata sent to the xDS server: key=value,key2=value2",
			Doc:   "node metadata: `key=value,key2=value2`",
			check: overXDS(x, func() error { _, err := x.NodeMetadataMap(); return err }),
			Ref:   []RefVar{{Name: "CONFIG_GRPC_XDS_NODE_METADATA"}}},
		{Name: FlagXDSHeaders, bind: stringFlag(&x.Headers, ""),
			Help:  "gRPC metadata sent with the xDS stream: key:value,key2:value2",
			Doc:   "gRPC metadata sent with the xDS stream: `key:value,key2:value2`",
			check: overXDS(x, func() error { _, err := x.HeaderMap(); return err }),
			Ref:   []RefVar{{Name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"}}},
		{Name: "xds-tls", bind: boolFlag(&x.TLS, false),
			Help: "speak TLS to the xDS server",
			Doc:  "speak TLS to the xDS server (1.2 minimum)",
			check: overXDS(x, func() error {
				switch {
				case !x.TLS && (x.TLSCert != "" || x.TLSKey != "" || x.TLSCA != "" || x.TLSSAN != ""):
					return errors.New("--xds-tls-* flags need --xds-tls")
				case x.TLS && (x.TLSCert == "") != (x.TLSKey == ""):
					return errors.New("--xds-tls-cert and --xds-tls-key go together: set both or neither")
				}
				return nil
			}),
			Ref: []RefVar{{Name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Default: "false", Conv: convBool}}},
		{Name: "xds-tls-cert", bind: stringFlag(&x.TLSCert, ""),
			Help: "PEM client certificate presented to the xDS server, with --xds-tls-key; reloaded",
			Doc:  "client certificate presented to the xDS server (mutual TLS), with `--xds-tls-key`. Reloaded when the file changes",
			Ref:  []RefVar{{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"}}},
		{Name: "xds-tls-key", bind: stringFlag(&x.TLSKey, ""),
			Help: "PEM private key of --xds-tls-cert; reloaded when the file changes",
			Doc:  "PEM private key of `--xds-tls-cert`. Reloaded when the file changes",
			Ref:  []RefVar{{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"}}},
		{Name: "xds-tls-ca", bind: stringFlag(&x.TLSCA, ""),
			Help: "PEM CA certificates for the xDS server's certificate, instead of the system roots",
			Doc:  "PEM CA for the xDS server's certificate instead of the system roots (read at start)",
			Ref:  []RefVar{{Name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"}}},
		{Name: "xds-tls-san", bind: stringFlag(&x.TLSSAN, ""),
			Help: "name the xDS server's certificate must hold, when not the --xds-server-url host",
			Doc:  "the name the xDS server's certificate must hold, when not the URL's host",
			Ref:  []RefVar{{Name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN"}}},
	}
}

// xdsStreamSettings: the xDS stream's retries and bound, and whether the
// service waits for its first config.
func xdsStreamSettings(s *Settings) []Setting {
	x := &s.XDS
	return []Setting{
		{Name: "xds-backoff-initial", bind: durationFlag(&x.BackoffInitial, xdsconfig.DefaultBackoffInitial),
			Help: "wait before a new xDS stream after one ends; grows by --xds-backoff-factor with each failure",
			Doc:  "wait before a new xDS stream after one ends; multiplied by `--xds-backoff-factor` at each failed attempt",
			check: overXDS(x, func() error {
				if x.BackoffInitial <= 0 || x.BackoffMax < x.BackoffInitial {
					return fmt.Errorf("--xds-backoff-initial (%v) must be positive and --xds-backoff-max (%v) at least as long",
						x.BackoffInitial, x.BackoffMax)
				}
				return nil
			}),
			Ref: []RefVar{{Name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Default: "10s", Conv: convDuration}}},
		{Name: "xds-backoff-max", bind: durationFlag(&x.BackoffMax, xdsconfig.DefaultBackoffMax),
			Help: "longest wait between xDS stream attempts",
			Ref:  []RefVar{{Name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", Default: "60s", Conv: convDuration}}},
		{Name: "xds-backoff-factor", bind: floatFlag(&x.BackoffFactor, 2),
			Help: "multiplier of the xDS backoff wait at each failed attempt; below 1 the wait stays at the initial one",
			Doc: "multiplier of that wait; below 1 it stays at the initial wait (the reference's " +
				"`XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, `0.5` there)",
			check: overXDS(x, func() error {
				if !(x.BackoffFactor > 0) || math.IsInf(x.BackoffFactor, 0) {
					return fmt.Errorf("--xds-backoff-factor: %v is not a positive number", x.BackoffFactor)
				}
				return nil
			}),
			Ref: []RefVar{{Name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Default: "0.5"}}},
		{Name: "xds-backoff-jitter", bind: boolFlag(&x.BackoffJitter, true),
			Help: "draw each xDS backoff wait at random from its upper half",
			Doc:  "draw each wait at random from its upper half",
			Ref:  []RefVar{{Name: "XDS_CLIENT_BACKOFF_JITTER", Default: "true", Conv: convBool}}},
		{Name: "xds-max-msg-size", bind: intFlag(&x.MaxMsgSize, 0),
			Help: "largest xDS response accepted, in bytes; 0: gRPC's default, 4 MiB",
			Doc:  "largest xDS response accepted, in bytes; `0`: gRPC's 4 MiB",
			check: overXDS(x, func() error {
				if x.MaxMsgSize < 0 {
					return fmt.Errorf("--xds-max-msg-size: %d is not a number of bytes", x.MaxMsgSize)
				}
				return nil
			}),
			Ref: []RefVar{{Name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}}},
		{Name: "force-start-without-initial-config", bind: boolFlag(&x.ForceStart, false),
			Help: "over xDS, listen at once, not once the first config came; until then calls fail with UNAVAILABLE",
			Doc: "over xDS, listen at once instead of once the first config has arrived; until it does, rate limit calls fail " +
				"with `UNAVAILABLE` and Envoy's failure mode decides",
			Ref: []RefVar{{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Default: "false", Conv: convBool}}},
	}
}

// tracingSettings: OpenTelemetry; the checks apply only with --tracing.
func tracingSettings(s *Settings) []Setting {
	tr := &s.Tracing
	traced := func(check func() error) func() error {
		return func() error {
			if !tr.Enabled {
				return nil
			}
			return check()
		}
	}
	return []Setting{
		{Name: "tracing", bind: boolFlag(&tr.Enabled, false),
			Help: "trace gRPC calls with OpenTelemetry, exported over OTLP to OTEL_EXPORTER_OTLP_ENDPOINT",
			Doc: "OpenTelemetry spans of gRPC calls (child of the caller's `traceparent` or `b3`), exported over OTLP where " +
				"the standard `OTEL_EXPORTER_OTLP_*` variables say",
			Ref: []RefVar{{Name: "TRACING_ENABLED", Default: "false", Conv: convBool, Here: "--tracing: OpenTelemetry spans of " +
				"gRPC calls, exported over OTLP where OTEL_EXPORTER_OTLP_* say (read by the exporter, as there)"}}},
		{Name: "tracing-exporter-protocol", bind: stringFlag(&tr.ExporterProtocol, "http"),
			Help: "OTLP over http or grpc",
			Doc:  "OTLP over `http` or `grpc`",
			check: traced(func() error {
				if p := tr.ExporterProtocol; p != "http" && p != "" && p != "grpc" {
					return fmt.Errorf("--tracing-exporter-protocol=%q: http or grpc", p)
				}
				return nil
			}),
			Ref: []RefVar{{Name: "TRACING_EXPORTER_PROTOCOL", Default: "http"}}},
		{Name: "tracing-sampling-rate", bind: floatFlag(&tr.SamplingRate, 1),
			Help: "share of traces sampled when the caller did not decide (parent-based): 0 to 1",
			Doc:  "share of traces sampled when the caller did not decide, 0 to 1",
			check: traced(func() error {
				return want(!(tr.SamplingRate < 0 || tr.SamplingRate > 1), tr.SamplingRate, "a share from 0 to 1")
			}),
			Ref: []RefVar{{Name: "TRACING_SAMPLING_RATE", Default: "1", Conv: convFloat}}},
		{Name: "tracing-service-name", bind: stringFlag(&tr.ServiceName, "RateLimit"),
			Help: "service.name of the traces",
			Doc:  "`service.name` of the spans",
			Ref:  []RefVar{{Name: "TRACING_SERVICE_NAME", Default: "RateLimit"}}},
		{Name: "tracing-service-namespace", bind: stringFlag(&tr.ServiceNamespace, ""),
			Help: "service.namespace of the traces",
			Doc:  "`service.namespace` of the spans",
			Ref:  []RefVar{{Name: "TRACING_SERVICE_NAMESPACE"}}},
		{Name: "tracing-service-instance-id", bind: stringFlag(&tr.ServiceInstanceID, ""),
			Help: "service.instance.id of the traces; empty: a random UUID",
			Doc:  "`service.instance.id` of the spans; empty: a random UUID",
			Ref:  []RefVar{{Name: "TRACING_SERVICE_INSTANCE_ID"}}},
	}
}
