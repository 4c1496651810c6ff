package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// The environment of envoyproxy/ratelimit (the reference), so that its
// deployments (Envoy Gateway's, Istio's sample) switch by changing the image.
// Every variable its src/settings/settings.go reads (commit f2fb157) has a
// row in envTable: the flag it sets here, or why it has no effect. A flag on
// the command line wins, then RATELIMIT_<FLAG>, then the reference's
// variable, then the flag's default.

// envVar is one variable of the reference.
type envVar struct {
	name string
	def  string // the reference's default, "" for none
	// flag is the flag the variable sets, alone or with the others of its
	// group (listeners, Redis, TLS, config path, metrics); "" when it has no
	// effect here. A flag this build does not have (another part's, not
	// merged yet) leaves the variable without effect, logged as such.
	flag string
	// conv turns the reference's value into the flag's (nil: as is). Group
	// variables have none: their group's function reads them together.
	conv func(string) (string, error)
	// here is what it does here: docs/migration.md is generated from it.
	here string
}

// The groups of flags set together from several variables.
const (
	groupRedis   = "redis"
	groupGRPCTLS = "grpc-tls"
	groupMetrics = "metrics"
)

// envTable is every variable of the reference.
var envTable = []envVar{
	// Listeners.
	{name: "HOST", def: "0.0.0.0", flag: "http-addr", here: "with PORT: --http-addr (/healthcheck, POST /json, /metrics, /rlconfig)"},
	{name: "PORT", def: "8080", flag: "http-addr", here: "with HOST: --http-addr"},
	{name: "GRPC_HOST", def: "0.0.0.0", flag: "grpc-addr", here: "with GRPC_PORT: --grpc-addr"},
	{name: "GRPC_PORT", def: "8081", flag: "grpc-addr", here: "with GRPC_HOST: --grpc-addr"},
	{name: "GRPC_UDS", flag: "grpc-addr", here: "--grpc-addr unix:PATH: gRPC on a Unix socket instead of GRPC_HOST:GRPC_PORT"},
	{name: "DEBUG_HOST", def: "0.0.0.0", flag: "debug-addr", here: "with DEBUG_PORT: --debug-addr (/rlconfig as text); the debug port opens at 0.0.0.0:6070 whenever the reference's environment is in use"},
	{name: "DEBUG_PORT", def: "6070", flag: "debug-addr", here: "with DEBUG_HOST: --debug-addr"},
	{name: "GRPC_MAX_CONNECTION_AGE", def: "24h", flag: "grpc-max-connection-age", conv: duration},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", def: "1h", flag: "grpc-max-connection-age-grace", conv: duration},
	{name: "GRPC_SERVER_USE_TLS", def: "false", flag: "grpc-tls-cert", here: "true: the gRPC listener serves TLS (--grpc-tls-cert, --grpc-tls-key from GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY)"},
	{name: "GRPC_SERVER_TLS_CERT", flag: "grpc-tls-cert", here: "--grpc-tls-cert, when GRPC_SERVER_USE_TLS=true (reloaded on change, as the reference's)"},
	{name: "GRPC_SERVER_TLS_KEY", flag: "grpc-tls-key", here: "--grpc-tls-key, when GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_CACERT", flag: "grpc-tls-client-ca", here: "--grpc-tls-client-ca (clients must present a certificate), when GRPC_SERVER_USE_TLS=true"},
	{name: "GRPC_CLIENT_TLS_SAN", flag: "grpc-tls-client-san", here: "--grpc-tls-client-san, when GRPC_SERVER_USE_TLS=true"},
	// Logs.
	{name: "LOG_LEVEL", def: "WARN", flag: "log-level", conv: logLevel, here: "--log-level (trace: debug; fatal, panic: error); unset, the level stays info"},
	{name: "LOG_FORMAT", def: "text", flag: "log-format", conv: logFormat, here: "--log-format: json, or console for any other value; unset, the format stays json"},
	// Config.
	{name: "CONFIG_TYPE", def: "FILE", flag: "config-type"},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", def: "false", flag: "force-start-without-initial-config", conv: boolean},
	{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", flag: "xds-node-id"},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", flag: "xds-node-metadata"},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", def: "localhost:18000", flag: "xds-server-url"},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", here: "no effect: gRPC's own reconnection backoff and the stream backoff (--xds-backoff-initial, --xds-backoff-max) cover it"},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", flag: "xds-headers"},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", def: "false", flag: "xds-tls", conv: boolean},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", flag: "xds-tls-cert"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", flag: "xds-tls-key"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", flag: "xds-tls-ca"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", flag: "xds-tls-san"},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def: "10s", flag: "xds-backoff-initial", conv: duration},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", def: "60s", flag: "xds-backoff-max", conv: duration},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def: "0.5", flag: "xds-backoff-factor"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", def: "true", flag: "xds-backoff-jitter", conv: boolean},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", flag: "xds-max-msg-size"},
	{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", flag: "config", here: "--config is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, the directory the reference reads"},
	{name: "RUNTIME_SUBDIRECTORY", flag: "config", here: "see RUNTIME_ROOT"},
	{name: "RUNTIME_APPDIRECTORY", def: "config", flag: "config", here: "see RUNTIME_ROOT"},
	{name: "RUNTIME_IGNOREDOTFILES", def: "false", here: "no effect: dot files are always skipped (as are files not *.yaml / *.yml, and subdirectories)"},
	{name: "RUNTIME_WATCH_ROOT", def: "true", here: "no effect: the config directory is watched either way (--watch-config), ConfigMap updates included"},
	{name: "MERGE_DOMAIN_CONFIG", def: "false", flag: "merge-domain-config", conv: boolean},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", def: "false", here: "no effect: the service is ready only with a config (a file config loads before serving; over xDS it waits for the first one, unless FORCE_START_WITHOUT_INITIAL_CONFIG, and then answers UNAVAILABLE until one arrives)"},
	// Stats.
	{name: "USE_STATSD", def: "true", here: "no effect: no statsd sink; metrics are Prometheus only (true is logged as a warning)"},
	{name: "STATSD_HOST", def: "localhost", here: "no effect (no statsd)"},
	{name: "STATSD_PORT", def: "8125", here: "no effect (no statsd)"},
	{name: "USE_DOG_STATSD", def: "false", here: "no effect (no statsd)"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", here: "no effect (no statsd)"},
	{name: "EXTRA_TAGS", here: "no effect: add labels in the Prometheus scrape config"},
	{name: "STATS_FLUSH_INTERVAL", def: "10s", here: "no effect: Prometheus metrics are current at every scrape"},
	{name: "DISABLE_STATS", def: "false", here: "no effect: metrics are always kept (a scrape is what costs)"},
	{name: "USE_PROMETHEUS", def: "false", flag: "metrics-addr", here: "true: the metrics are served on PROMETHEUS_ADDR at PROMETHEUS_PATH too (--metrics-addr, --metrics-path), with the reference's names beside this service's"},
	{name: "PROMETHEUS_ADDR", def: ":9090", flag: "metrics-addr", here: "with USE_PROMETHEUS=true: --metrics-addr"},
	{name: "PROMETHEUS_PATH", def: "/metrics", flag: "metrics-path", here: "with USE_PROMETHEUS=true: --metrics-path"},
	{name: "PROMETHEUS_MAPPER_YAML", here: "no effect: the reference's default mapping is built in (a custom one changing names or labels is not read)"},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", def: "false", here: "no effect: ratelimit_service_response_time_seconds is in seconds"},
	// Limits.
	{name: "EXPIRATION_JITTER_MAX_SECONDS", def: "300", here: "no effect: keys expire with their window"},
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", def: "0", flag: "deny-cache", conv: localCache, here: "0: --deny-cache=0 (no local cache of denials); more: the deny cache stays on (--deny-cache), bounded by entries, not bytes"},
	{name: "NEAR_LIMIT_RATIO", def: "0.8", flag: "near-limit-ratio", conv: float},
	{name: "CACHE_KEY_PREFIX", flag: "key-prefix", here: "--key-prefix: before every Redis key"},
	{name: "BACKEND_TYPE", def: "redis", here: "redis is the only backend: memcache or another value refuses to start"},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", def: "false", here: "no effect: a denied hit is never counted here, as if always true"},
	{name: "SHADOW_MODE", def: "false", flag: "shadow-mode", conv: boolean, here: "--shadow-mode (here each status is OK too, not only the overall code)"},
	{name: "QUOTA_MODE", def: "false", flag: "quota-mode", conv: boolean},
	{name: "RESPONSE_DYNAMIC_METADATA", def: "false", flag: "response-dynamic-metadata", conv: boolean},
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", def: "false", flag: "ratelimit-headers", conv: boolean},
	{name: "LIMIT_LIMIT_HEADER", def: "RateLimit-Limit", flag: "ratelimit-limit-header"},
	{name: "LIMIT_REMAINING_HEADER", def: "RateLimit-Remaining", flag: "ratelimit-remaining-header"},
	{name: "LIMIT_RESET_HEADER", def: "RateLimit-Reset", flag: "ratelimit-reset-header"},
	// Redis.
	{name: "REDIS_SOCKET_TYPE", def: "unix", flag: "redis-url", here: "tcp or unix; unset, a REDIS_URL starting with / is a Unix socket, any other TCP"},
	{name: "REDIS_TYPE", def: "SINGLE", flag: "redis-url", here: "SINGLE: --redis-url; CLUSTER: --redis-cluster-url; SENTINEL: --redis-sentinel-url"},
	{name: "REDIS_URL", def: "/var/run/nutcracker/ratelimit.sock", flag: "redis-url", here: "host:port, a socket path, or a redis:// URL; CLUSTER: host:port,host:port,...; SENTINEL: master,host:port,host:port,...; required when any REDIS_* is set"},
	{name: "REDIS_AUTH", flag: "redis-url", here: "password, or user:password, put into the Redis URL"},
	{name: "REDIS_SENTINEL_AUTH", flag: "redis-sentinel-url", here: "password, or user:password, of the Sentinels"},
	{name: "REDIS_TLS", def: "false", flag: "redis-url", here: "true: rediss:// (TLS to Redis, and to the Sentinels)"},
	{name: "REDIS_TLS_CLIENT_CERT", flag: "redis-tls-cert", here: "--redis-tls-cert, when REDIS_TLS=true"},
	{name: "REDIS_TLS_CLIENT_KEY", flag: "redis-tls-key", here: "--redis-tls-key, when REDIS_TLS=true"},
	{name: "REDIS_TLS_CACERT", flag: "redis-tls-ca", here: "--redis-tls-ca, when REDIS_TLS=true"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", flag: "redis-tls-skip-hostname-verification", here: "--redis-tls-skip-hostname-verification, when REDIS_TLS=true"},
	{name: "REDIS_POOL_SIZE", def: "10", here: "no effect: requests are batched on a few connections per Redis server"},
	{name: "REDIS_PIPELINE_WINDOW", def: "0", here: "no effect: requests are always batched (no added wait)"},
	{name: "REDIS_PIPELINE_LIMIT", def: "0", here: "no effect (deprecated in the reference too)"},
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", def: "1", here: "no effect: the slot groups of a request are asked in parallel"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", def: "false", here: "no effect: a Redis that refuses the credentials keeps the service unready; one that is down is answered by each rule's failure_mode"},
	{name: "REDIS_TIMEOUT", def: "10s", here: "no effect: --store-timeout bounds a request's store work"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", here: "no effect (no pool to run out of)"},
	{name: "REDIS_STARTUP_INITIAL_INTERVAL", def: "1s", here: "no effect: the service starts without waiting for Redis and reconnects on its own"},
	{name: "REDIS_STARTUP_MAX_INTERVAL", def: "30s", here: "no effect (see REDIS_STARTUP_INITIAL_INTERVAL)"},
	{name: "REDIS_STARTUP_MAX_ELAPSED_TIME", def: "0", here: "no effect (see REDIS_STARTUP_INITIAL_INTERVAL)"},
	{name: "REDIS_PERSECOND", def: "false", here: "no effect: per-second limits are counted on REDIS_URL's Redis with the others (true is logged as a warning)"},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", def: "unix", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TYPE", def: "SINGLE", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_URL", def: "/var/run/nutcracker/ratelimitpersecond.sock", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_SIZE", def: "10", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_AUTH", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TLS", def: "false", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", def: "0", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", def: "0", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", def: "1", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TIMEOUT", def: "10s", here: "no effect (see REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", here: "no effect (see REDIS_PERSECOND)"},
	// Memcache: no such backend here (BACKEND_TYPE=memcache refuses to start).
	{name: "MEMCACHE_HOST_PORT", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_MAX_IDLE_CONNS", def: "2", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_SRV", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_SRV_REFRESH", def: "0", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_TLS", def: "false", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_TLS_CLIENT_CERT", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_TLS_CLIENT_KEY", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_TLS_CACERT", here: "no effect: no memcache backend"},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", here: "no effect: no memcache backend"},
	// Tracing.
	{name: "TRACING_ENABLED", def: "false", flag: "tracing", conv: boolean, here: "--tracing: OpenTelemetry spans of gRPC calls, exported over OTLP where OTEL_EXPORTER_OTLP_* say (read by the exporter, as there)"},
	{name: "TRACING_SERVICE_NAME", def: "RateLimit", flag: "tracing-service-name"},
	{name: "TRACING_SERVICE_NAMESPACE", flag: "tracing-service-namespace"},
	{name: "TRACING_SERVICE_INSTANCE_ID", flag: "tracing-service-instance-id"},
	{name: "TRACING_EXPORTER_PROTOCOL", def: "http", flag: "tracing-exporter-protocol"},
	{name: "TRACING_SAMPLING_RATE", def: "1", flag: "tracing-sampling-rate", conv: float},
}

// envLookup reads one variable: its value and whether it is set (an empty
// value is set, as the reference's envconfig takes it).
type envLookup func(name string) (string, bool)

// envValue is a flag value the reference's environment asks for.
type envValue struct {
	flag, value string
	from        string // the variables it comes from, for messages
	group       string // set together: a group is skipped whole when any of its flags is set otherwise
}

// envNote is logged once at start.
type envNote struct {
	warn bool
	msg  string
	vars []string
}

// envPlan is what the reference's environment asks for.
type envPlan struct {
	values []envValue
	notes  []envNote
	// inUse: a variable of the reference is set.
	inUse bool
	// redis: a Redis variable of the reference (REDIS_*, BACKEND_TYPE) is set.
	redis bool
	// redisGroup: the variables set that planRedis reads (names only).
	redisGroup []string

	explicit map[string]bool // flags and groups set on the command line or by RATELIMIT_*
}

func (p *envPlan) set(flag, value, from, group string) {
	if p.explicit[flag] || group != "" && p.explicit[group] {
		return
	}
	p.values = append(p.values, envValue{flag: flag, value: value, from: from, group: group})
}

func (p *envPlan) note(warn bool, msg string, vars ...string) {
	p.notes = append(p.notes, envNote{warn: warn, msg: msg, vars: vars})
}

// groupFlags are the flags a group sets together: when any of them is set
// on the command line or by RATELIMIT_*, the group's variables are left out
// whole (a --redis-url and a REDIS_TYPE=CLUSTER would make two stores).
var groupFlags = map[string][]string{
	groupRedis: {"redis-url", "redis-cluster-url", "redis-sentinel-url", "redis-tls-ca", "redis-tls-cert",
		"redis-tls-key", "redis-tls-skip-hostname-verification"},
	groupGRPCTLS: {"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca", "grpc-tls-client-san"},
	groupMetrics: {"metrics-addr", "metrics-path"},
}

// planEnv reads the reference's variables through lookup. hasFlag says
// which flags this build has, explicit which ones the command line or
// RATELIMIT_* set: those win.
func planEnv(lookup envLookup, hasFlag, explicit func(string) bool) (*envPlan, error) {
	p := &envPlan{explicit: explicitFlags(envTable, explicit)}
	for g, flags := range groupFlags {
		for _, f := range flags {
			if explicit(f) {
				p.explicit[g] = true
			}
		}
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		if ok {
			p.inUse = true
		}
		return v, ok
	}
	var noEffect []string
	for _, v := range envTable {
		val, ok := get(v.name)
		if !ok {
			continue
		}
		if strings.HasPrefix(v.name, "REDIS_") || v.name == "BACKEND_TYPE" {
			p.redis = true
		}
		if v.flag != "" && slices.Contains(groupFlags[groupRedis], v.flag) {
			p.redisGroup = append(p.redisGroup, v.name)
		}
		switch {
		case v.flag == "":
			noEffect = append(noEffect, v.name)
		case !hasFlag(v.flag):
			p.note(true, "no effect in this build: its flag --"+v.flag+" is not here", v.name)
		case v.conv != nil:
			val, err := v.conv(val)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			if val != "" { // "": the flag keeps its value
				p.set(v.flag, val, v.name, "")
			}
		case isSimple(v):
			p.set(v.flag, val, v.name, "")
		}
	}

	if len(noEffect) > 0 {
		p.note(false, "variables of envoyproxy/ratelimit with no effect here (README, Migration)", noEffect...)
	}
	steps := []func(*envPlan, func(string) (string, bool)) error{
		planListeners, planConfigPath, planGRPCTLS, planMetrics, planMisc, planRedis,
	}
	for _, step := range steps {
		if err := step(p, get); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// explicitFlags are the table's flags set otherwise than by the reference's
// variables.
func explicitFlags(table []envVar, explicit func(string) bool) map[string]bool {
	m := map[string]bool{}
	for _, v := range table {
		if v.flag != "" && explicit(v.flag) {
			m[v.flag] = true
		}
	}
	return m
}

// isSimple reports a variable whose value goes to its flag as is; group
// variables are read by their group's function.
func isSimple(v envVar) bool {
	switch v.flag {
	case "http-addr", "grpc-addr", "debug-addr", "config", "grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca",
		"grpc-tls-client-san", "metrics-addr", "metrics-path", "redis-url", "redis-sentinel-url", "redis-tls-cert",
		"redis-tls-key", "redis-tls-ca", "redis-tls-skip-hostname-verification":
		return false
	}
	return true
}

// defaultOf is the reference's default of a variable.
func defaultOf(name string) string {
	for _, v := range envTable {
		if v.name == name {
			return v.def
		}
	}
	panic("no variable " + name)
}

// hostPort joins a host and a port variable with the reference's defaults;
// ok is false when neither is set.
func hostPort(get func(string) (string, bool), hostVar, portVar string) (addr string, ok bool, err error) {
	host, hostSet := get(hostVar)
	port, portSet := get(portVar)
	if !hostSet && !portSet {
		return "", false, nil
	}
	if !hostSet {
		host = defaultOf(hostVar)
	}
	if !portSet {
		port = defaultOf(portVar)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("%s: %q is not a port number", portVar, port)
	}
	return net.JoinHostPort(host, port), true, nil
}

func planListeners(p *envPlan, get func(string) (string, bool)) error {
	if addr, ok, err := hostPort(get, "HOST", "PORT"); err != nil {
		return err
	} else if ok {
		p.set("http-addr", addr, "HOST/PORT", "")
	}
	if uds, ok := get("GRPC_UDS"); ok && uds != "" {
		p.set("grpc-addr", "unix:"+uds, "GRPC_UDS", "")
	} else if addr, ok, err := hostPort(get, "GRPC_HOST", "GRPC_PORT"); err != nil {
		return err
	} else if ok {
		p.set("grpc-addr", addr, "GRPC_HOST/GRPC_PORT", "")
	}
	addr, ok, err := hostPort(get, "DEBUG_HOST", "DEBUG_PORT")
	if err != nil {
		return err
	}
	if !ok && p.inUse {
		// The reference always serves its debug port; tools read /rlconfig
		// there (egctl at 6070).
		addr, ok = net.JoinHostPort(defaultOf("DEBUG_HOST"), defaultOf("DEBUG_PORT")), true
	}
	if ok {
		p.set("debug-addr", addr, "DEBUG_HOST/DEBUG_PORT", "")
	}
	return nil
}

func planConfigPath(p *envPlan, get func(string) (string, bool)) error {
	root, rootSet := get("RUNTIME_ROOT")
	sub, subSet := get("RUNTIME_SUBDIRECTORY")
	app, appSet := get("RUNTIME_APPDIRECTORY")
	if !rootSet && !subSet && !appSet {
		return nil
	}
	if !rootSet {
		root = defaultOf("RUNTIME_ROOT")
	}
	if !appSet {
		app = defaultOf("RUNTIME_APPDIRECTORY")
	}
	p.set("config", filepath.Join(root, sub, app), "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY", "")
	return nil
}

func planGRPCTLS(p *envPlan, get func(string) (string, bool)) error {
	vars := []struct{ name, flag string }{
		{"GRPC_SERVER_TLS_CERT", "grpc-tls-cert"}, {"GRPC_SERVER_TLS_KEY", "grpc-tls-key"},
		{"GRPC_CLIENT_TLS_CACERT", "grpc-tls-client-ca"}, {"GRPC_CLIENT_TLS_SAN", "grpc-tls-client-san"},
	}
	on, err := boolVar(get, "GRPC_SERVER_USE_TLS")
	if err != nil {
		return err
	}
	if !on {
		var unused []string
		for _, v := range vars {
			if _, ok := get(v.name); ok {
				unused = append(unused, v.name)
			}
		}
		if len(unused) > 0 {
			p.note(true, "no effect without GRPC_SERVER_USE_TLS=true (as in the reference): the gRPC listener is plaintext", unused...)
		}
		return nil
	}
	for _, v := range vars[:2] {
		if val, _ := get(v.name); val == "" && !p.explicit[groupGRPCTLS] {
			// The reference would start and fail every handshake.
			return fmt.Errorf("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY: %s is not set", v.name)
		}
	}
	for _, v := range vars {
		if val, ok := get(v.name); ok && val != "" {
			p.set(v.flag, val, v.name, groupGRPCTLS)
		}
	}
	return nil
}

func planMetrics(p *envPlan, get func(string) (string, bool)) error {
	on, err := boolVar(get, "USE_PROMETHEUS")
	if err != nil {
		return err
	}
	if !on {
		if _, ok := get("PROMETHEUS_ADDR"); ok {
			p.note(false, "no effect without USE_PROMETHEUS=true; metrics are on the HTTP port's /metrics", "PROMETHEUS_ADDR")
		}
		return nil
	}
	addr, ok := get("PROMETHEUS_ADDR")
	if !ok {
		addr = defaultOf("PROMETHEUS_ADDR")
	}
	path, ok := get("PROMETHEUS_PATH")
	if !ok {
		path = defaultOf("PROMETHEUS_PATH")
	}
	p.set("metrics-addr", addr, "USE_PROMETHEUS/PROMETHEUS_ADDR", groupMetrics)
	p.set("metrics-path", path, "PROMETHEUS_PATH", groupMetrics)
	return nil
}

func planMisc(p *envPlan, get func(string) (string, bool)) error {
	if on, err := boolVar(get, "USE_STATSD"); err != nil {
		return err
	} else if _, set := get("USE_STATSD"); on && set {
		p.note(true, "no statsd sink here: metrics are Prometheus only, on the HTTP port's /metrics (and PROMETHEUS_ADDR with USE_PROMETHEUS=true)", "USE_STATSD")
	}
	if b, ok := get("BACKEND_TYPE"); ok && b != "redis" && b != "" {
		return fmt.Errorf("BACKEND_TYPE=%q: Redis is the only backend here", b)
	}
	if on, err := boolVar(get, "REDIS_PERSECOND"); err != nil {
		return err
	} else if on {
		p.note(true, "per-second limits are counted on REDIS_URL's Redis with the others: REDIS_PERSECOND_* have no effect", "REDIS_PERSECOND")
	}
	return nil
}

// planRedis turns REDIS_* into one of --redis-url, --redis-cluster-url and
// --redis-sentinel-url, and the TLS flags.
func planRedis(p *envPlan, get func(string) (string, bool)) error {
	raw, urlSet := get("REDIS_URL")
	if p.explicit[groupRedis] && len(p.redisGroup) > 0 {
		p.note(true, "ignored: a --redis-* flag or RATELIMIT_REDIS_* variable is set, and the Redis settings come from there alone", p.redisGroup...)
	}
	if !p.redis || p.explicit[groupRedis] {
		return nil
	}
	if !urlSet {
		return errors.New("a REDIS_* variable is set but REDIS_URL is not: set REDIS_URL (or --redis-url), or unset every REDIS_* to run on the embedded store (one replica, counting alone)")
	}
	if raw == "" {
		return errors.New("REDIS_URL is empty")
	}
	tlsOn, err := boolVar(get, "REDIS_TLS")
	if err != nil {
		return err
	}
	socket, socketSet := get("REDIS_SOCKET_TYPE")
	socket = strings.ToLower(socket)
	if socketSet && socket != "tcp" && socket != "unix" {
		return fmt.Errorf("REDIS_SOCKET_TYPE=%q: tcp or unix", socket)
	}
	typ, typeSet := get("REDIS_TYPE")
	if !typeSet {
		typ = defaultOf("REDIS_TYPE")
	}
	auth, _ := get("REDIS_AUTH")
	scheme := "redis"
	if tlsOn {
		scheme = "rediss"
	}
	var flag, u string
	switch strings.ToLower(typ) {
	case "single":
		flag = "redis-url"
		u, err = singleURL(raw, socket, scheme, auth, tlsOn)
	case "cluster":
		flag = "redis-cluster-url"
		u, err = listURL(strings.Split(raw, ","), scheme, auth, "")
	case "sentinel":
		flag = "redis-sentinel-url"
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" {
			return errors.New("REDIS_URL: with REDIS_TYPE=SENTINEL, the form is MASTER_NAME,host:port[,host:port...]")
		}
		sentinelAuth, _ := get("REDIS_SENTINEL_AUTH")
		u, err = listURL(parts[1:], scheme, sentinelAuth, parts[0])
		if err == nil && auth != "" {
			user, pass := splitAuth(auth)
			q := url.Values{}
			if user != "" {
				q.Set("username", user)
			}
			q.Set("password", pass)
			u += "&" + q.Encode()
		}
	default:
		return fmt.Errorf("REDIS_TYPE=%q: SINGLE, CLUSTER or SENTINEL", typ)
	}
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	if _, ok := get("REDIS_SENTINEL_AUTH"); ok && flag != "redis-sentinel-url" {
		p.note(true, "no effect without REDIS_TYPE=SENTINEL", "REDIS_SENTINEL_AUTH")
	}
	p.set(flag, u, "REDIS_URL", groupRedis)

	tlsVars := []struct{ name, flag string }{
		{"REDIS_TLS_CACERT", "redis-tls-ca"}, {"REDIS_TLS_CLIENT_CERT", "redis-tls-cert"}, {"REDIS_TLS_CLIENT_KEY", "redis-tls-key"},
	}
	var unused []string
	for _, v := range tlsVars {
		val, ok := get(v.name)
		switch {
		case !ok || val == "":
		case tlsOn:
			p.set(v.flag, val, v.name, groupRedis)
		default:
			unused = append(unused, v.name)
		}
	}
	skip, err := boolVar(get, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil {
		return err
	}
	if skip && tlsOn {
		p.set("redis-tls-skip-hostname-verification", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", groupRedis)
	} else if skip {
		unused = append(unused, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	}
	if len(unused) > 0 {
		p.note(true, "no effect without REDIS_TLS=true (as in the reference)", unused...)
	}
	return nil
}

// singleURL is the go-redis URL of REDIS_TYPE=SINGLE: REDIS_URL is a
// host:port (tcp), a socket path (unix), or already a redis:// or rediss://
// URL, which REDIS_AUTH completes when it has no credentials.
func singleURL(raw, socket, scheme, auth string, tlsOn bool) (string, error) {
	if strings.HasPrefix(raw, "redis://") || strings.HasPrefix(raw, "rediss://") || strings.HasPrefix(raw, "unix://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("%q is not a valid URL", limiter.RedactURL(raw))
		}
		if tlsOn && u.Scheme == "redis" {
			u.Scheme = "rediss"
		}
		if u.User == nil && auth != "" {
			u.User = userinfo(auth)
		}
		return u.String(), nil
	}
	if socket == "unix" || socket == "" && strings.HasPrefix(raw, "/") {
		if tlsOn {
			return "", errors.New("REDIS_TLS=true with a Unix socket")
		}
		path, err := filepath.Abs(raw) // relative to the working directory, as a dial takes it
		if err != nil {
			return "", err
		}
		u := url.URL{Scheme: "unix", Path: path}
		if auth != "" {
			u.User = userinfo(auth)
		}
		return u.String(), nil
	}
	return listURL([]string{raw}, scheme, auth, "")
}

// listURL is a go-redis URL naming addrs (host:port each): the first as the
// URL's host, the others as addr parameters; master names a Sentinel
// master.
func listURL(addrs []string, scheme, auth, master string) (string, error) {
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil || host == "" || strings.Contains(host, "@") {
			return "", fmt.Errorf("%q is not host:port (credentials go in REDIS_AUTH)", shownAddr(a))
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return "", fmt.Errorf("%q: the port is not a number from 1 to 65535", shownAddr(a))
		}
	}
	u := url.URL{Scheme: scheme, Host: strings.TrimSpace(addrs[0])}
	if auth != "" {
		u.User = userinfo(auth)
	}
	q := url.Values{}
	for _, a := range addrs[1:] {
		q.Add("addr", strings.TrimSpace(a))
	}
	if master != "" {
		q.Set("master_name", master)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// shownAddr is an address fit for an error message: a URL's password
// hidden (limiter.RedactURL), and without a scheme, whatever precedes an '@'
// (user:password@host:port).
func shownAddr(a string) string {
	if strings.Contains(a, "://") {
		return limiter.RedactURL(a)
	}
	if at := strings.LastIndexByte(a, '@'); at >= 0 {
		return "xxxxx" + a[at:]
	}
	return a
}

// splitAuth reads REDIS_AUTH as the reference does: user:password, or a
// password alone.
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

func userinfo(auth string) *url.Userinfo {
	return url.UserPassword(splitAuth(auth))
}

func boolVar(get func(string) (string, bool), name string) (bool, error) {
	v, ok := get(name)
	if !ok {
		v = defaultOf(name)
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false", name, v)
	}
	return b, nil
}

// Converters of single variables.

func boolean(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return "", fmt.Errorf("%q is not true or false", v)
	}
	return strconv.FormatBool(b), nil
}

func duration(v string) (string, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return "", fmt.Errorf("%q is not a duration like 30s", v)
	}
	return d.String(), nil
}

func float(v string) (string, error) {
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return "", fmt.Errorf("%q is not a number", v)
	}
	return v, nil
}

// logLevel maps logrus's levels to zap's.
func logLevel(v string) (string, error) {
	switch l := strings.ToLower(v); l {
	case "trace", "debug":
		return "debug", nil
	case "info":
		return "info", nil
	case "warn", "warning":
		return "warn", nil
	case "error", "fatal", "panic":
		return "error", nil
	}
	return "", fmt.Errorf("%q is not a log level (trace, debug, info, warn, error)", v)
}

// logFormat: the reference writes JSON for "json" and text for anything else.
func logFormat(v string) (string, error) {
	if strings.EqualFold(v, "json") {
		return "json", nil
	}
	return "console", nil
}

// localCache maps LOCAL_CACHE_SIZE_IN_BYTES: 0 turns the deny cache off;
// a size keeps its default.
func localCache(v string) (string, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return "", fmt.Errorf("%q is not a size in bytes", v)
	}
	if n == 0 {
		return "0s", nil
	}
	return "", nil
}
