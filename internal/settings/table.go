package settings

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/hotkeys"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/transport"
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

// table is every setting, bound to s, in docs/flags.md's order: the groups'
// functions, here, in table_conns.go and table_regions.go, each a run of that table. A new setting
// is one entry in its group (and its field in Settings).
func table(s *Settings) []Setting {
	return slices.Concat(
		configSettings(s),
		listenerSettings(s),
		redisSettings(s),
		ruleSettings(s),
		requestSettings(s),
		rlqsSettings(s),
		hotKeySettings(s),
		regionSettings(s),
		answerSettings(s),
		tlsSettings(s),
		grpcPortSettings(s),
		processSettings(s),
		xdsSettings(s),
		xdsStreamSettings(s),
		rolloutSettings(s),
		shutdownSettings(s),
		tracingSettings(s),
		logSettings(s),
	)
}

// configSettings: the config's files.
func configSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// listenerSettings: the gRPC, HTTP and debug listeners, the metrics' own port and
// the statsd server sent the reference's stats.
func listenerSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// ruleSettings: what a rule that says nothing about it gets.
func ruleSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// requestSettings: the bounds of one request.
func requestSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// rlqsSettings: the Rate Limit Quota Service's reports and assignments.
func rlqsSettings(s *Settings) []Setting {
	return []Setting{
		{Name: "rlqs-report-interval", bind: durationFlag(&s.RLQSReportInterval, rlqs.DefaultReportInterval),
			Help: "how often Envoys report to the Rate Limit Quota Service (Envoy's is 5s, whatever its reporting_interval)",
			Doc: "how often Envoys send their usage to the Rate Limit Quota Service: Envoy reports every 5 s whatever its " +
				"filter's `reporting_interval` says. A token bucket holds about one interval's refill (see [RLQS](rlqs.md))",
			check: func() error {
				return want(s.RLQSReportInterval >= time.Second, s.RLQSReportInterval, "a duration of 1s or more")
			}},
		{Name: "rlqs-lease", bind: durationFlag(&s.RLQSLease, rlqs.DefaultLease),
			Help: "how long an RLQS assignment lives unless renewed: whole seconds, at least twice --rlqs-report-interval and 1s",
			Doc: "how long a Rate Limit Quota Service assignment lives unless a report renews it (its " +
				"`assignment_time_to_live`), and how far ahead its token bucket's refills are leased from the counter: whole " +
				"seconds (Envoy reads no fraction), at least two report intervals and a second, so that one lost report " +
				"expires nothing",
			check: func() error {
				return want(s.RLQSLease >= 2*s.RLQSReportInterval+time.Second && s.RLQSLease%time.Second == 0, s.RLQSLease,
					"whole seconds, at least twice --rlqs-report-interval and 1s")
			}},
	}
}

// hotKeySettings: the slices hot keys are decided from at this instance.
func hotKeySettings(s *Settings) []Setting {
	return []Setting{
		{Name: "hot-key-threshold", bind: floatFlag(&s.HotKeyThreshold, hotkeys.DefaultSliceThreshold),
			Help: "hits/s of one counter at this instance from which it is decided from leased slices; 0: off",
			Doc: "hits per second of one counter at this instance from which the instance leases a slice of the counter's " +
				"limit from Redis (charged there before a unit is used) and decides the counter's hits from it, without a " +
				"Redis call, until the slice is used up or ends. `0` turns slices off: every hit is a Redis call " +
				"([reliability.md](reliability.md#hot-keys))",
			check: func() error { return want(s.HotKeyThreshold >= 0, s.HotKeyThreshold, "a rate, 0 for off") }},
		{Name: "hot-key-warm-threshold", bind: floatFlag(&s.HotKeyWarmThreshold, hotkeys.DefaultSliceWarmThreshold),
			Help: "hits/s of one counter at this instance, averaged over ~10s, from which a warm one gets small slices; 0: off",
			Doc: "hits per second of one counter at this instance, averaged over about ten seconds, from which a counter " +
				"under `--hot-key-threshold` (a warm one) is also decided from slices: of ten seconds of its demand, at least 4 units (at most a " +
				"quarter of what the counter has left), each ending after the time its units take at the counter's rate unused (at most 4 " +
				"units' time at this threshold), not after a period. Only for `fixed_window` and `sliding_window_counter`. `0`, or a rate at or above `--hot-key-threshold`, turns warm keys off: only hot keys are leased " +
				"([reliability.md](reliability.md#hot-keys))",
			check: func() error {
				return want(s.HotKeyWarmThreshold >= 0, s.HotKeyWarmThreshold, "a rate, 0 for off")
			}},
		{Name: "hot-key-slice-period", bind: durationFlag(&s.HotKeySlicePeriod, hotkeys.DefaultSlicePeriod),
			Help: "a hot key's slice holds this long of its demand and ends this long unused (window counters: see docs)",
			Doc: "a hot key's slice is sized to this instance's demand over this period, and ends after a period unused " +
				"(its unused units are then given back). A `sliding_window_log` slice lives at most this long and at most " +
				"a twentieth of its window. A fixed or sliding counter's ends with its window at the latest and, while " +
				"warm keys are on, holds ten seconds of the demand at least and ends after the time its units take at the counter's " +
				"rate unused (as a warm key's)",
			check: func() error {
				return want(s.HotKeySlicePeriod >= time.Millisecond, s.HotKeySlicePeriod, "a duration of 1ms or more")
			}},
	}
}

// answerSettings: what answers carry, the merging of a domain's definitions and
// the admin API's listener.
func answerSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// processSettings: the keys' prefix, the bound of requests in flight, the heap's
// limit, the profiler and the watching of the config.
func processSettings(s *Settings) []Setting {
	return []Setting{
		{Name: "key-prefix", bind: stringFlag(&s.KeyPrefix, ""),
			Help: "prefix of every Redis key, to keep apart services sharing one Redis (no '{' or '}')",
			Doc:  "before every Redis key, to keep apart services sharing one Redis",
			check: func() error {
				return want(!strings.ContainsAny(s.KeyPrefix, "{}"), s.KeyPrefix, "no '{' or '}', which would change the Redis Cluster hash tag")
			},
			Ref: []RefVar{{Name: "CACHE_KEY_PREFIX", Here: "--key-prefix: before every Redis key"}}},
		{Name: "max-inflight", bind: intFlag(&s.MaxInFlight, transport.DefaultMaxInFlight),
			Help: "most rate limit requests worked on at once; past it, or past a connection's share, RESOURCE_EXHAUSTED",
			Doc: "most rate limit requests worked on at once, gRPC and `POST /json` together, a gRPC call counted once its " +
				"message has come whole; past it a request is refused at once (`RESOURCE_EXHAUSTED`, or HTTP 503; Envoy then " +
				"applies its own failure mode) instead of queueing without bound. So that no client takes every place, once " +
				"half are taken a connection holding more than `max/(n+1)` of them (`n` connections holding any) is refused " +
				"too: one connection alone gets at most half. Health checks are never refused. At Envoy's 20 ms deadline, 512 " +
				"in flight is about 25,000 requests/s per instance, above what one instance serves; it also bounds memory: " +
				"in-flight requests times their size (see [Reliability](reliability.md))",
			check: func() error { return want(s.MaxInFlight > 0, s.MaxInFlight, "a number above 0") }},
		{Name: "max-connections", bind: intFlag(&s.MaxConnections, transport.DefaultMaxConnections),
			Help: "most connections open at once on the gRPC port; past it a new one is closed at accept",
			Doc: "most connections open at once on the gRPC port; past it a new connection is closed as soon as it is " +
				"accepted (Envoy then connects to another instance or retries), counted in " +
				"`ratelimit_transport_refusals_total{reason=\"connections\"}`. An Envoy opens one per worker thread. " +
				"What one connection can make the service hold is bounded (see [Reliability](reliability.md#memory-per-connection)), " +
				"so this bounds the memory connections take",
			check: func() error { return want(s.MaxConnections > 0, s.MaxConnections, "a number above 0") }},
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
	}
}

// rolloutSettings: shadow mode and the near-limit share.
func rolloutSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// shutdownSettings: what SIGTERM does.
func shutdownSettings(s *Settings) []Setting {
	return []Setting{
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
	}
}

// logSettings: the log's level and format.
func logSettings(s *Settings) []Setting {
	return []Setting{
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
