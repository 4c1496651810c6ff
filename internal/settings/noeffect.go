package settings

// noEffect are the reference's variables that set no flag here, each with
// why: with the table's variables, every variable the reference's
// src/settings/settings.go reads (commit f2fb157, and one added later),
// which testdata/reference-env.txt lists.
var noEffect = []RefVar{
	// Config.
	{Name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Default: "3s",
		Here: "no effect: gRPC's own reconnection backoff and the stream backoff (--xds-backoff-initial, --xds-backoff-max) cover it"},
	{Name: "RUNTIME_WATCH_ROOT", Default: "true",
		Here: "no effect: the config directory is watched either way (--watch-config), ConfigMap updates and subdirectories included"},
	{Name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Default: "false",
		Here: "no effect: the service is ready only with a config (a file config loads before serving; over xDS it waits for the first one, " +
			"unless FORCE_START_WITHOUT_INITIAL_CONFIG, and then answers UNAVAILABLE until one arrives)"},
	// Stats.
	{Name: "USE_DOG_STATSD", Default: "false", Here: "no effect: no DogStatsD sink (the reference's is its own, over datadog-go); " +
		"--statsd-addr sends plain statsd, tags as name suffixes"},
	{Name: "USE_DOG_STATSD_MOGRIFIERS", Here: "no effect (see USE_DOG_STATSD)"},
	{Name: "PROMETHEUS_MAPPER_YAML", Here: "no effect: the reference's default mapping is built in (a custom one changing names or labels is not read)"},
	{Name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Default: "false", Here: "no effect: ratelimit_service_response_time_seconds is in seconds"},
	// Limits.
	{Name: "EXPIRATION_JITTER_MAX_SECONDS", Default: "300",
		Here: "no effect: keys expire with their window (reference_fixed_window's a window after their first count, without jitter)"},
	{Name: "BACKEND_TYPE", Default: "redis", Here: "redis is the only backend: memcache or another value refuses to start"},
	{Name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Default: "false", Here: "no effect: a denied hit is never counted here, as if always true"},
	{Name: "USE_CALENDAR_MONTH_RATE_LIMIT", Default: "false",
		Here: "no effect: reference_fixed_window's months are the reference's default, 30 days from the Unix epoch; " +
			"the reference with it true keys UTC calendar months otherwise, so a swap does not share their counts " +
			"(docs/migration.md, calendar windows)"},
	// Redis.
	{Name: "REDIS_POOL_SIZE", Default: "10", Here: "no effect: requests are batched on a few connections per Redis server"},
	{Name: "REDIS_PIPELINE_WINDOW", Default: "0", Here: "no effect: requests are always batched (no added wait)"},
	{Name: "REDIS_PIPELINE_LIMIT", Default: "0", Here: "no effect (deprecated in the reference too)"},
	{Name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", Default: "1", Here: "no effect: the slot groups of a request are asked in parallel"},
	{Name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Default: "false",
		Here: "no effect: a Redis that refuses the credentials keeps the service unready; one that is down is answered by each rule's failure_mode"},
	{Name: "REDIS_TIMEOUT", Default: "10s", Here: "no effect: --store-timeout bounds a request's store work"},
	{Name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", Default: "WAIT", Here: "no effect (no pool to run out of)"},
	{Name: "REDIS_STARTUP_INITIAL_INTERVAL", Default: "1s", Here: "no effect: the service starts without waiting for Redis and reconnects on its own"},
	{Name: "REDIS_STARTUP_MAX_INTERVAL", Default: "30s", Here: "no effect (see REDIS_STARTUP_INITIAL_INTERVAL)"},
	{Name: "REDIS_STARTUP_MAX_ELAPSED_TIME", Default: "0", Here: "no effect (see REDIS_STARTUP_INITIAL_INTERVAL)"},
	{Name: "REDIS_PERSECOND_POOL_SIZE", Default: "10", Here: "no effect, as REDIS_POOL_SIZE"},
	{Name: "REDIS_PERSECOND_PIPELINE_WINDOW", Default: "0", Here: "no effect, as REDIS_PIPELINE_WINDOW"},
	{Name: "REDIS_PERSECOND_PIPELINE_LIMIT", Default: "0", Here: "no effect, as REDIS_PIPELINE_LIMIT"},
	{Name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Default: "1", Here: "no effect, as REDIS_CLUSTER_PIPELINE_PARALLELISM"},
	{Name: "REDIS_PERSECOND_TIMEOUT", Default: "10s", Here: "no effect, as REDIS_TIMEOUT"},
	{Name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Default: "WAIT", Here: "no effect, as REDIS_POOL_ON_EMPTY_BEHAVIOR"},
	// Memcache: no such backend here (BACKEND_TYPE=memcache refuses to start).
	{Name: "MEMCACHE_HOST_PORT", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_MAX_IDLE_CONNS", Default: "2", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_SRV", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_SRV_REFRESH", Default: "0", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_TLS", Default: "false", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_TLS_CLIENT_CERT", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_TLS_CLIENT_KEY", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_TLS_CACERT", Here: "no effect: no memcache backend"},
	{Name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Default: "false", Here: "no effect: no memcache backend"},
}
