package settings

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/quota"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig"
)

// The names of the flags that code refers to, beyond their table entry.
const (
	FlagConfig               = "config"
	FlagConfigFiles          = "config-files"
	FlagGRPCAddr             = "grpc-addr"
	FlagHTTPAddr             = "http-addr"
	FlagDebugAddr            = "debug-addr"
	FlagMetricsAddr          = "metrics-addr"
	FlagMetricsPath          = "metrics-path"
	FlagStatsdAddr           = "statsd-addr"
	FlagStatsdTags           = "statsd-tags"
	FlagAdminAddr            = "admin-addr"
	FlagRedisURL             = "redis-url"
	FlagRedisClusterURL      = "redis-cluster-url"
	FlagRedisSentinelURL     = "redis-sentinel-url"
	FlagRedisTLSCA           = "redis-tls-ca"
	FlagRedisTLSCert         = "redis-tls-cert"
	FlagRedisTLSKey          = "redis-tls-key"
	FlagRedisTLSSkipHostname = "redis-tls-skip-hostname-verification"
	FlagGRPCTLSCert          = "grpc-tls-cert"
	FlagGRPCTLSKey           = "grpc-tls-key"
	FlagGRPCTLSClientCA      = "grpc-tls-client-ca"
	FlagGRPCTLSClientSAN     = "grpc-tls-client-san"
	FlagDefaultAlgorithm     = "default-algorithm"
	FlagDefaultFailureMode   = "default-failure-mode"
	FlagRecordCosts          = "record-costs"
	FlagXDSNodeMetadata      = "xds-node-metadata"
	FlagXDSHeaders           = "xds-headers"

	// The per-second Redis: the reference's REDIS_PERSECOND_*.
	FlagRedisPerSecondURL         = "redis-persecond-url"
	FlagRedisPerSecondClusterURL  = "redis-persecond-cluster-url"
	FlagRedisPerSecondSentinelURL = "redis-persecond-sentinel-url"
)

// table is every setting, bound to s, in docs/flags.md's order. A new
// setting is one entry here (and its field in Settings).
func table(s *Settings) []Setting {
	x, gt, rt, tr := &s.XDS, &s.GRPCTLS, &s.RedisTLS, &s.Tracing
	overXDS := func(check func() error) func() error {
		return func() error {
			if x.ConfigType != ConfigTypeXDS {
				return nil
			}
			return check()
		}
	}
	traced := func(check func() error) func() error {
		return func() error {
			if !tr.Enabled {
				return nil
			}
			return check()
		}
	}
	return []Setting{
		// Config.
		{Name: FlagConfig, bind: stringFlag(&s.ConfigPath, ""), DocDefault: "(required)",
			Help: "config file, or directory of them (--config-files) (required, unless --config-type GRPC_XDS_SOTW)",
			Doc: "a config file, or a directory: the files `--config-files` says, by default every `*.yaml` / `*.yml` directly " +
				"in it; one domain per YAML document. " +
				"Or `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`config`, as envoyproxy/ratelimit. Not read with `--config-type GRPC_XDS_SOTW`",
			Ref: []RefVar{
				{Name: "RUNTIME_ROOT", Default: "/srv/runtime_data/current", Joint: true,
					Here: "--config is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, the directory the reference reads"},
				{Name: "RUNTIME_SUBDIRECTORY", Joint: true, Here: "see RUNTIME_ROOT"},
				{Name: "RUNTIME_APPDIRECTORY", Default: "config", Joint: true, Here: "see RUNTIME_ROOT"},
			}},
		{Name: FlagConfigFiles, bind: stringFlag(&s.ConfigFiles, config.YAMLFiles.String()),
			Help: "files read in a --config dir: yaml (*.yaml/*.yml in it), all (every file, recursively), visible (no dot files)",
			Doc: "the files of a `--config` directory read: `yaml`, the `*.yaml` / `*.yml` directly in it, dot files skipped; " +
				"`all`, every file under it whatever its name, in subdirectories too, as envoyproxy/ratelimit reads; " +
				"`visible`, the same without dot files and dot directories (a Kubernetes ConfigMap's `..data`), as the reference " +
				"with `RUNTIME_IGNOREDOTFILES=true`. A file that is not a valid config fails the load",
			check: func() error {
				if _, err := config.ParseFileSet(s.ConfigFiles); err != nil {
					return fmt.Errorf("--%s: %w", FlagConfigFiles, err)
				}
				return nil
			},
			Ref: []RefVar{{Name: "RUNTIME_IGNOREDOTFILES", Default: "false", Joint: true,
				Here: "with the reference's config directory (RUNTIME_ROOT and the like, not --config): --config-files visible " +
					"when true, all when false, the files the reference reads"}}},
		// Listeners.
		{Name: FlagGRPCAddr, bind: stringFlag(&s.GRPCAddr, ":8081"),
			Help: "gRPC listen address (rate limit service, health, reflection); unix:PATH for a Unix socket",
			Doc:  "gRPC listener: the rate limit service, `grpc.health.v1.Health`, server reflection; `unix:PATH` for a Unix socket",
			Ref: []RefVar{
				{Name: "GRPC_HOST", Default: "0.0.0.0", Joint: true, Here: "with GRPC_PORT: --grpc-addr"},
				{Name: "GRPC_PORT", Default: "8081", Joint: true, Here: "with GRPC_HOST: --grpc-addr"},
				{Name: "GRPC_UDS", Joint: true, Here: "--grpc-addr unix:PATH: gRPC on a Unix socket instead of GRPC_HOST:GRPC_PORT"},
			}},
		{Name: FlagHTTPAddr, bind: stringFlag(&s.HTTPAddr, ":8080"),
			Help: "HTTP listen address: /healthz, /readyz, /healthcheck, /metrics, /rlconfig, POST /json",
			Doc: "HTTP listener: `GET /healthz` (alive), `GET /readyz` and `/healthcheck` (503, 500, while draining or while Redis " +
				"refuses the credentials), `GET /metrics`, `GET /rlconfig`, `POST /json` (see [Operations](operations.md))",
			Ref: []RefVar{
				{Name: "HOST", Default: "0.0.0.0", Joint: true, Here: "with PORT: --http-addr (/healthcheck, POST /json, /metrics, /rlconfig)"},
				{Name: "PORT", Default: "8080", Joint: true, Here: "with HOST: --http-addr"},
			}},
		{Name: FlagDebugAddr, bind: stringFlag(&s.DebugAddr, ""),
			Help: "debug port: /rlconfig as text, /debug/pprof/ with --pprof; empty: off",
			Doc: "envoyproxy/ratelimit's debug port: `/rlconfig` as text (what `egctl` reads), `/debug/pprof/` with `--pprof`. " +
				"Opens at `0.0.0.0:6070` when the reference's variables are in use",
			Ref: []RefVar{
				{Name: "DEBUG_HOST", Default: "0.0.0.0", Joint: true, Here: "with DEBUG_PORT: --debug-addr (/rlconfig as text); " +
					"the debug port opens at 0.0.0.0:6070 whenever the reference's environment is in use"},
				{Name: "DEBUG_PORT", Default: "6070", Joint: true, Here: "with DEBUG_HOST: --debug-addr"},
			}},
		{Name: FlagMetricsAddr, bind: stringFlag(&s.MetricsAddr, ""), Group: groupMetrics,
			Help: "a port serving only the metrics, at --metrics-path; empty: off (they are on the HTTP port either way)",
			Doc:  "a port serving only the metrics, at `--metrics-path` (the reference's `PROMETHEUS_ADDR`)",
			Ref: []RefVar{
				{Name: "USE_PROMETHEUS", Default: "false", Joint: true, Here: "true: the metrics are served on PROMETHEUS_ADDR at " +
					"PROMETHEUS_PATH too (--metrics-addr, --metrics-path), with the reference's names beside this service's"},
				{Name: "PROMETHEUS_ADDR", Default: ":9090", Joint: true, Here: "with USE_PROMETHEUS=true: --metrics-addr"},
			}},
		{Name: FlagMetricsPath, bind: stringFlag(&s.MetricsPath, "/metrics"), Group: groupMetrics,
			Help: "path of the metrics on --metrics-addr",
			Doc:  "the metrics' path on `--metrics-addr`",
			check: func() error {
				return want(strings.HasPrefix(s.MetricsPath, "/"), s.MetricsPath, "a path starting with /")
			},
			Ref: []RefVar{
				{Name: "PROMETHEUS_PATH", Default: "/metrics", Joint: true, Here: "with USE_PROMETHEUS=true: --metrics-path"},
			}},
		{Name: FlagStatsdAddr, bind: stringFlag(&s.StatsdAddr, ""),
			Help: "host:port of a statsd server sent envoyproxy/ratelimit's stats, beside the Prometheus metrics; empty: off",
			Doc: "`host:port` of a statsd server sent envoyproxy/ratelimit's stats under its statsd names, as it sends them " +
				"(its library, lyft/gostats), beside the Prometheus metrics; empty: off (see [Metrics](metrics.md#statsd))",
			check: func() error {
				if s.StatsdAddr == "" {
					return nil
				}
				_, port, err := net.SplitHostPort(s.StatsdAddr)
				return want(err == nil && port != "", s.StatsdAddr, "host:port")
			},
			Ref: []RefVar{
				{Name: "USE_STATSD", Default: "true", Joint: true, Here: "true, or unset with any variable of the reference set, " +
					"as there: --statsd-addr STATSD_HOST:STATSD_PORT; false: no statsd. Unset with USE_PROMETHEUS or USE_DOG_STATSD " +
					"true (two sinks, which the reference refuses to start with): no statsd, logged as a warning"},
				{Name: "STATSD_HOST", Default: "localhost", Joint: true, Here: "with STATSD_PORT: --statsd-addr"},
				{Name: "STATSD_PORT", Default: "8125", Joint: true, Here: "with STATSD_HOST: --statsd-addr"},
				{Name: "DISABLE_STATS", Default: "false", Joint: true,
					Here: "true: no statsd (the reference's null sink); the Prometheus metrics stay"},
			}},
		{Name: "statsd-protocol", bind: stringFlag(&s.StatsdProtocol, "tcp"),
			Help: "tcp or udp (or tcp4, tcp6, udp4, udp6) to --statsd-addr",
			Doc:  "`tcp` or `udp` (or `tcp4`, `tcp6`, `udp4`, `udp6`) to `--statsd-addr`",
			check: func() error {
				ok := slices.Contains([]string{"tcp", "tcp4", "tcp6", "udp", "udp4", "udp6"}, s.StatsdProtocol)
				return want(ok, s.StatsdProtocol, "tcp or udp")
			},
			Ref: []RefVar{{Name: "STATSD_PROTOCOL", Default: "tcp",
				Here: "--statsd-protocol (read by the reference's stats library, lyft/gostats, from the environment)"}}},
		{Name: "statsd-flush-interval", bind: durationFlag(&s.StatsdFlushInterval, 10*time.Second),
			Help: "how often the stats go to --statsd-addr",
			Doc:  "how often the stats go to `--statsd-addr`: counters as what they gained since the last flush, as the reference",
			check: func() error {
				return want(s.StatsdFlushInterval > 0, s.StatsdFlushInterval, "a duration above 0")
			},
			Ref: []RefVar{{Name: "STATS_FLUSH_INTERVAL", Default: "10s", Conv: convDuration}}},
		{Name: FlagStatsdTags, bind: stringFlag(&s.StatsdTags, ""),
			Help:  "tags of every stat sent to --statsd-addr: key:value,key2:value2",
			Doc:   "tags of every stat sent to `--statsd-addr`, `key:value,key2:value2`, each a `.__key=value` suffix of the name, as the reference",
			check: func() error { _, err := s.StatsdTagMap(); return err },
			Ref: []RefVar{{Name: "EXTRA_TAGS",
				Here: "--statsd-tags (the Prometheus metrics get no labels from it: add them in the scrape config)"}}},
		// Redis.
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
		// Rules.
		{Name: FlagDefaultAlgorithm, bind: stringFlag(&s.DefaultAlgorithm, config.SlidingWindowCounter.String()),
			Help: "default algorithm: " + orList(config.AlgorithmNames()),
			Doc: "algorithm of rules that name none. `reference_fixed_window` when any of the reference's variables is set " +
				"and neither this flag nor `RATELIMIT_DEFAULT_ALGORITHM` is: envoyproxy/ratelimit's own counters, shared with " +
				"its replicas (see [Migration](migration.md#the-swap-step-by-step))",
			check: func() error {
				_, err := config.ParseAlgorithm(s.DefaultAlgorithm)
				return flagError(FlagDefaultAlgorithm, err)
			}},
		{Name: FlagDefaultFailureMode, bind: stringFlag(&s.DefaultFailureMode, ""),
			Help: "store-down answer of rules that name none: allow or deny; empty: UNAVAILABLE, for Envoy to decide",
			Doc: "store-down answer of rules that name no `failure_mode`: `allow` or `deny`. Empty: such rules defer to Envoy " +
				"(the request fails with `UNAVAILABLE`, Envoy's `failure_mode_deny` decides)",
			check: func() error {
				if s.DefaultFailureMode == "" {
					return nil
				}
				if _, err := config.ParseFailureMode(s.DefaultFailureMode); err != nil {
					return fmt.Errorf("--%s: %w, or empty to defer to Envoy", FlagDefaultFailureMode, err)
				}
				return nil
			}},
		{Name: FlagRecordCosts, bind: stringFlag(&s.RecordCosts, config.RecordDescriptorCosts.String()),
			Help: "costs recorded even past the limit, for rules without record_costs: descriptor, always or never",
			Doc: "which costs are recorded even past the limit, for rules without `record_costs`: `descriptor` (a cost in the " +
				"descriptor's own `hits_addend`, as Envoy sends `apply_on_stream_done` reports), `always`, `never` " +
				"(see [Budgets and costs](budgets.md))",
			check: func() error {
				_, err := config.ParseCostRecording(s.RecordCosts)
				return flagError(FlagRecordCosts, err)
			}},
		// Requests.
		{Name: "max-descriptors", bind: intFlag(&s.MaxDescriptors, service.DefaultMaxDescriptors),
			Help:  "most descriptors in one request",
			check: func() error { return want(s.MaxDescriptors > 0, s.MaxDescriptors, "a number above 0") }},
		{Name: "max-entries", bind: intFlag(&s.MaxEntries, service.DefaultMaxEntries),
			Help:  "most entries in one descriptor",
			check: func() error { return want(s.MaxEntries > 0, s.MaxEntries, "a number above 0") }},
		{Name: "max-request-bytes", bind: intFlag(&s.MaxRequestBytes, service.DefaultMaxRequestBytes),
			Help: "largest request in bytes: a gRPC message past it gets RESOURCE_EXHAUSTED, a POST /json body 413",
			Doc: "largest request: a gRPC message past it is refused by gRPC with `RESOURCE_EXHAUSTED` before the service reads " +
				"it, a `POST /json` body with 413. Envoy takes 60 KiB of headers by default and several descriptors may copy one " +
				"header. Values of any length or bytes within it are limited like others (see [Key schema](stores.md#key-schema))",
			check: func() error { return want(s.MaxRequestBytes > 0, s.MaxRequestBytes, "a positive number of bytes") }},
		// Rate Limit Quota Service.
		{Name: "rlqs-report-interval", bind: durationFlag(&s.RLQSReportInterval, quota.DefaultReportInterval),
			Help: "how often Envoys report to the Rate Limit Quota Service (Envoy's is 5s, whatever its reporting_interval)",
			Doc: "how often Envoys send their usage to the Rate Limit Quota Service: Envoy reports every 5 s whatever its " +
				"filter's `reporting_interval` says. A token bucket holds about one interval's refill (see [RLQS](rlqs.md))",
			check: func() error {
				return want(s.RLQSReportInterval >= time.Second, s.RLQSReportInterval, "a duration of 1s or more")
			}},
		{Name: "rlqs-lease", bind: durationFlag(&s.RLQSLease, quota.DefaultLease),
			Help: "how long an RLQS assignment lives unless renewed: whole seconds, at least twice --rlqs-report-interval and 1s",
			Doc: "how long a Rate Limit Quota Service assignment lives unless a report renews it (its " +
				"`assignment_time_to_live`), and how far ahead its token bucket's refills are leased from the counter: whole " +
				"seconds (Envoy reads no fraction), at least two report intervals and a second, so that one lost report " +
				"expires nothing",
			check: func() error {
				return want(s.RLQSLease >= 2*s.RLQSReportInterval+time.Second && s.RLQSLease%time.Second == 0, s.RLQSLease,
					"whole seconds, at least twice --rlqs-report-interval and 1s")
			}},
		// Answers.
		{Name: "ratelimit-headers", bind: boolFlag(&s.RateLimitHeaders, false),
			Help: "add the limit, remaining and reset headers to answers (off: Envoy's enable_x_ratelimit_headers may)",
			Doc: "add the limit, remaining and reset headers to answers, as the reference's `LIMIT_RESPONSE_HEADERS_ENABLED` " +
				"(see [Answers](answers.md)). Off: Envoy's `enable_x_ratelimit_headers` builds its own from the statuses",
			Ref: []RefVar{{Name: "LIMIT_RESPONSE_HEADERS_ENABLED", Default: "false", Conv: convBool}}},
		{Name: "ratelimit-limit-header", bind: stringFlag(&s.LimitHeader, service.DefaultLimitHeader),
			Help: "name of the limit header of --ratelimit-headers",
			Doc:  "name of the limit header (the reference's `LIMIT_LIMIT_HEADER`)",
			Ref:  []RefVar{{Name: "LIMIT_LIMIT_HEADER", Default: "RateLimit-Limit"}}},
		{Name: "ratelimit-remaining-header", bind: stringFlag(&s.RemainingHeader, service.DefaultRemainingHeader),
			Help: "name of the remaining header of --ratelimit-headers",
			Doc:  "name of the remaining header (`LIMIT_REMAINING_HEADER`)",
			Ref:  []RefVar{{Name: "LIMIT_REMAINING_HEADER", Default: "RateLimit-Remaining"}}},
		{Name: "ratelimit-reset-header", bind: stringFlag(&s.ResetHeader, service.DefaultResetHeader),
			Help: "name of the reset header of --ratelimit-headers",
			Doc:  "name of the reset header (`LIMIT_RESET_HEADER`)",
			Ref:  []RefVar{{Name: "LIMIT_RESET_HEADER", Default: "RateLimit-Reset"}}},
		{Name: "merge-domain-config", bind: boolFlag(&s.MergeDomainConfig, false),
			Help: "merge config files (or documents) of one domain instead of refusing the second",
			Doc: "merge the files (or documents) that define one domain, as the reference's `MERGE_DOMAIN_CONFIG`; off: a second " +
				"definition of a domain is an error",
			Ref: []RefVar{{Name: "MERGE_DOMAIN_CONFIG", Default: "false", Conv: convBool}}},
		{Name: "quota-mode", bind: boolFlag(&s.QuotaMode, false),
			Help: "every descriptor in quota mode: a request is denied only when all its quota descriptors are over",
			Doc:  "every descriptor in quota mode (the reference's `QUOTA_MODE`; see [Answers](answers.md))",
			Ref: []RefVar{{Name: "QUOTA_MODE", Default: "false", Conv: convBool,
				Here: "`--quota-mode`: a request is denied when all its descriptors are over (the reference's never denies: see What differs)"}}},
		{Name: "response-dynamic-metadata", bind: boolFlag(&s.ResponseDynamicMetadata, false),
			Help: "fill answers' dynamic_metadata: domain, descriptors, and the metadata of the admitted descriptors' rules",
			Doc:  "fill answers' `dynamic_metadata` (the reference's `RESPONSE_DYNAMIC_METADATA`; see [Answers](answers.md))",
			Ref: []RefVar{{Name: "RESPONSE_DYNAMIC_METADATA", Default: "false", Conv: convBool,
				Here: "`--response-dynamic-metadata`, without the reference's quotaModeEnabled and quotaModeViolations"}}},
		{Name: FlagAdminAddr, bind: stringFlag(&s.AdminAddr, ""),
			Help: "gRPC listen address of the admin API (Inspect, Reset); empty: off. Keep it private: Reset lifts limits",
			Doc:  "gRPC listener of the admin API (Inspect, Reset) with reflection; empty: off. Never reachable by Envoy or clients: Reset lifts limits"},
		// TLS.
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
		// The gRPC port.
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
		{Name: "key-prefix", bind: stringFlag(&s.KeyPrefix, ""),
			Help: "prefix of every Redis key, to keep apart services sharing one Redis (no '{' or '}')",
			Doc:  "before every Redis key, to keep apart services sharing one Redis",
			check: func() error {
				return want(!strings.ContainsAny(s.KeyPrefix, "{}"), s.KeyPrefix, "no '{' or '}', which would change the Redis Cluster hash tag")
			},
			Ref: []RefVar{{Name: "CACHE_KEY_PREFIX", Here: "--key-prefix: before every Redis key"}}},
		{Name: "max-inflight", bind: intFlag(&s.MaxInFlight, service.DefaultMaxInFlight),
			Help: "most rate limit requests worked on at once; past it, or past a connection's share, RESOURCE_EXHAUSTED",
			Doc: "most rate limit requests worked on at once, gRPC and `POST /json` together, a gRPC call counted once its " +
				"message has come whole; past it a request is refused at once (`RESOURCE_EXHAUSTED`, or HTTP 503; Envoy then " +
				"applies its own failure mode) instead of queueing without bound. So that no client takes every place, once " +
				"half are taken a connection holding more than `max/(n+1)` of them (`n` connections holding any) is refused " +
				"too: one connection alone gets at most half. Health checks are never refused. At Envoy's 20 ms deadline, 512 " +
				"in flight is about 25,000 requests/s per instance, above what one instance serves; it also bounds memory: " +
				"in-flight requests times their size (see [Reliability](reliability.md))",
			check: func() error { return want(s.MaxInFlight > 0, s.MaxInFlight, "a number above 0") }},
		{Name: "memory-limit", bind: byteSizeFlag(&s.MemoryLimit, DefaultMemoryLimit),
			Help: "soft limit of the Go heap, as GOMEMLIMIT (which wins when set); 0: none",
			Doc: "soft limit of the Go heap, written as `GOMEMLIMIT` is (`B`, `KiB`, `MiB`, `GiB`); `GOMEMLIMIT`, when set, wins. " +
				"Near it the GC collects harder instead of letting the heap grow to five times what is live (`GOGC=400`). " +
				"`0`: none. Below the central manifest's 256Mi; raise it with the container's limit"},
		{Name: "pprof", bind: boolFlag(&s.Pprof, false),
			Help: "serve Go's profiler at /debug/pprof/ on the HTTP port",
			Doc:  "serve Go's profiler at `/debug/pprof/` on the HTTP port"},
		{Name: "watch-config", bind: boolFlag(&s.WatchConfig, true),
			Help: "reload the config when its files change (a bad new config is refused, the old one stays)",
			Doc:  "reload the config when its files change (see [Operations](operations.md))"},
		// Config over xDS.
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
			check: overXDS(func() error {
				if x.NodeID == "" {
					return errors.New("--xds-node-id is empty")
				}
				return nil
			}),
			Ref: []RefVar{{Name: "CONFIG_GRPC_XDS_NODE_ID", Default: "default"}}},
		{Name: FlagXDSNodeMetadata, bind: stringFlag(&x.NodeMetadata, ""),
			Help:  "node metadata sent to the xDS server: key=value,key2=value2",
			Doc:   "node metadata: `key=value,key2=value2`",
			check: overXDS(func() error { _, err := x.NodeMetadataMap(); return err }),
			Ref:   []RefVar{{Name: "CONFIG_GRPC_XDS_NODE_METADATA"}}},
		{Name: FlagXDSHeaders, bind: stringFlag(&x.Headers, ""),
			Help:  "gRPC metadata sent with the xDS stream: key:value,key2:value2",
			Doc:   "gRPC metadata sent with the xDS stream: `key:value,key2:value2`",
			check: overXDS(func() error { _, err := x.HeaderMap(); return err }),
			Ref:   []RefVar{{Name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"}}},
		{Name: "xds-tls", bind: boolFlag(&x.TLS, false),
			Help: "speak TLS to the xDS server",
			Doc:  "speak TLS to the xDS server (1.2 minimum)",
			check: overXDS(func() error {
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
		{Name: "xds-backoff-initial", bind: durationFlag(&x.BackoffInitial, xdsconfig.DefaultBackoffInitial),
			Help: "wait before a new xDS stream after one ends; grows by --xds-backoff-factor with each failure",
			Doc:  "wait before a new xDS stream after one ends; multiplied by `--xds-backoff-factor` at each failed attempt",
			check: overXDS(func() error {
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
			check: overXDS(func() error {
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
			check: overXDS(func() error {
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
		// Roll-out.
		{Name: "shadow-mode", bind: boolFlag(&s.ShadowMode, false),
			Help: "deny nothing: the overall code is always OK, the statuses say what would be denied; counting goes on",
			Doc: "deny nothing: the overall code is always OK (no `retry-after`), while each descriptor's status, `OVER_LIMIT` " +
				"included, and the headers stay as they would be, as the reference's; counting goes on, would-be denials are logged " +
				"and counted. For a safe roll-out",
			Ref: []RefVar{{Name: "SHADOW_MODE", Default: "false", Conv: convBool}}},
		{Name: "near-limit-ratio", bind: floatFlag(&s.NearLimitRatio, 0.8),
			Help: "share of a limit in use from which an admitted decision counts as near_limit in metrics",
			Doc:  "share of a limit in use from which an admitted decision counts as `near_limit` in metrics",
			check: func() error {
				return want(s.NearLimitRatio > 0 && s.NearLimitRatio <= 1, s.NearLimitRatio, "a share above 0 and at most 1")
			},
			Ref: []RefVar{{Name: "NEAR_LIMIT_RATIO", Default: "0.8", Conv: convFloat}}},
		// Shutdown.
		{Name: "shutdown-delay", bind: durationFlag(&s.ShutdownDelay, 0),
			Help: "on SIGTERM, how long to keep serving while reporting NOT_SERVING, so load balancers move away first",
			Doc: "on SIGTERM/SIGINT: health turns NOT_SERVING and `/readyz` 503 at once, but the server keeps answering this " +
				"long, so load balancers and Envoy move away first (Kubernetes: a few seconds)",
			check: func() error { return want(s.ShutdownDelay >= 0, s.ShutdownDelay, "a duration, 0 for none") }},
		{Name: "drain-timeout", bind: durationFlag(&s.DrainTimeout, 10*time.Second),
			Help: "on SIGTERM, after the shutdown delay, how long in-flight requests may take before the server stops",
			Doc: "after the shutdown delay, in-flight requests get this long; then the process exits 0. A second signal " +
				"kills at once",
			check: func() error { return want(s.DrainTimeout > 0, s.DrainTimeout, "a duration above 0") }},
		// Tracing.
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
		// Logs.
		{Name: "log-level", bind: stringFlag(&s.LogLevel, "info"),
			Help: "debug, info, warn or error",
			Doc:  "`debug`, `info`, `warn`, `error`",
			check: func() error {
				_, err := zapcore.ParseLevel(s.LogLevel)
				return flagError("log-level", err)
			},
			Ref: []RefVar{{Name: "LOG_LEVEL", Default: "WARN", Conv: convLogLevel,
				Here: "--log-level (trace: debug; fatal, panic: error); unset, the level stays info"}}},
		{Name: "log-format", bind: stringFlag(&s.LogFormat, "json"),
			Help: "json or console",
			Doc:  "`json` or `console`",
			check: func() error {
				if s.LogFormat != "json" && s.LogFormat != "console" {
					return fmt.Errorf("--log-format: %q is not json or console", s.LogFormat)
				}
				return nil
			},
			Ref: []RefVar{{Name: "LOG_FORMAT", Default: "text", Conv: convLogFormat,
				Here: "--log-format: json, or console for any other value; unset, the format stays json"}}},
	}
}

// flagError names the flag an error is about; nil stays nil.
func flagError(name string, err error) error {
	if err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	return nil
}

// orList is "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
