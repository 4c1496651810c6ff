package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/service"
)

const usage = `usage:
  ratelimit [serve] [flags]            serve the rate limit service
  ratelimit validate --config PATH     check a config and exit

Every flag can also be set as RATELIMIT_<NAME> in the environment, e.g.
RATELIMIT_REDIS_URL for --redis-url; a flag on the command line wins. The
environment of envoyproxy/ratelimit (REDIS_URL, PORT, RUNTIME_ROOT, ...) is
read too, below both (README, Migration).

flags:
`

// settings are the command's flags.
type settings struct {
	configPath         string
	grpcAddr           string
	httpAddr           string
	redisURL           string
	redisClusterURL    string
	redisSentinelURL   string
	storeTimeout       time.Duration
	denyCache          time.Duration
	shutdownDelay      time.Duration
	drainTimeout       time.Duration
	logLevel           string
	logFormat          string
	defaultAlgorithm   string
	defaultFailureMode string
	recordCosts        string
	maxDescriptors     int
	maxEntries         int
	maxRequestBytes    int
	rateLimitHeaders   bool
	shadowMode         bool

	// The reference's config and answer switches (see README, Migration).
	mergeDomainConfig       bool
	responseDynamicMetadata bool
	quotaMode               bool
	limitHeader             string
	remainingHeader         string
	resetHeader             string

	nearLimitRatio      float64
	watchConfig         bool
	adminAddr           string
	maxInFlight         int
	memoryLimit         byteSize
	pprof               bool
	debugAddr           string
	metricsAddr         string
	metricsPath         string
	keyPrefix           string
	grpcMaxConnAge      time.Duration
	grpcMaxConnAgeGrace time.Duration
	grpcServer          string

	// Config over xDS, see xds.go.
	xds xdsSettings

	// Tracing, see tracing.go.
	tracing                                     bool
	tracingServiceName, tracingServiceNamespace string
	tracingServiceInstanceID, tracingProtocol   string
	tracingSamplingRate                         float64

	// env is what envoyproxy/ratelimit's environment asked for (env.go).
	env *envPlan
	// redisFlagSet: a --redis-* flag was given, on the command line or as
	// RATELIMIT_REDIS_*.
	redisFlagSet bool

	// TLS, see tls.go.
	grpcTLSCert, grpcTLSKey, grpcTLSClientCA, grpcTLSClientSAN string
	redisTLSCA, redisTLSCert, redisTLSKey, redisTLSServerName  string
	redisTLSSkipHostnameVerification                           bool
}

func newFlagSet(name string, s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&s.configPath, "config", "", "config file, or directory of *.yaml / *.yml files (required, unless --config-type GRPC_XDS_SOTW)")
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "gRPC listen address (rate limit service, health, reflection); unix:PATH for a Unix socket")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "HTTP listen address: /healthz, /readyz, /healthcheck, /metrics, /rlconfig, POST /json")
	fs.StringVar(&s.debugAddr, "debug-addr", "", "listen address of the debug port: /rlconfig as text, as envoyproxy/ratelimit's (and /debug/pprof/ with --pprof); empty: off")
	fs.StringVar(&s.metricsAddr, "metrics-addr", "", "listen address of a port serving only the metrics, at --metrics-path (as envoyproxy/ratelimit's PROMETHEUS_ADDR); empty: off (they are on the HTTP port's /metrics either way)")
	fs.StringVar(&s.metricsPath, "metrics-path", "/metrics", "path of the metrics on --metrics-addr")
	fs.StringVar(&s.keyPrefix, "key-prefix", "", "prefix of every Redis key, to keep apart the counters of services sharing one Redis (no '{' or '}')")
	fs.DurationVar(&s.grpcMaxConnAge, "grpc-max-connection-age", 24*time.Hour, "a gRPC connection older than this (±10%) is asked to go away, so clients spread over new replicas; 0: never")
	fs.DurationVar(&s.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", time.Hour, "how long calls may go on after --grpc-max-connection-age before the connection closes")
	fs.StringVar(&s.grpcServer, "grpc-server", grpcServerLean, "gRPC server of --grpc-addr: lean (this service's own HTTP/2 transport) or grpc-go (grpc-go's server, the same services, limits and TLS)")
	fs.StringVar(&s.redisURL, "redis-url", "", "redis:// or rediss:// URL of a standalone Redis; with no Redis flag, an embedded in-process store runs (one replica, not shared, not persistent)")
	fs.StringVar(&s.redisClusterURL, "redis-cluster-url", "", "Redis Cluster seed nodes: redis://[user:password@]host:port?addr=host2:port&addr=host3:port (or rediss://)")
	fs.StringVar(&s.redisSentinelURL, "redis-sentinel-url", "", "Redis Sentinel: redis://[sentinel-user:sentinel-password@]host:port?master_name=NAME&addr=host2:port[&username=U&password=P] (or rediss://)")
	fs.DurationVar(&s.storeTimeout, "store-timeout", limiter.DefaultTimeout, "upper bound of a request's store work, queueing included (the caller's deadline, less a margin to answer, normally ends it first); past it the rule's failure_mode answers (none: UNAVAILABLE, for Envoy to decide)")
	fs.DurationVar(&s.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, how long to keep serving while reporting NOT_SERVING, so load balancers and Envoy move away first")
	fs.DurationVar(&s.denyCache, "deny-cache", limiter.DefaultDenyCache, "how long at most a denial Redis gave is repeated from memory for the same counter, limit and cost (never past Redis's own wait); 0 turns it off")
	fs.DurationVar(&s.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, after the shutdown delay, how long in-flight requests may take before the server stops")
	fs.StringVar(&s.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&s.logFormat, "log-format", "json", "json or console")
	fs.StringVar(&s.defaultAlgorithm, "default-algorithm", config.SlidingWindowCounter.String(), "algorithm of rules that do not name one: sliding_window_log, sliding_window_counter, fixed_window or gcra")
	fs.StringVar(&s.defaultFailureMode, "default-failure-mode", "", "answer when the store cannot decide, for rules that do not say: allow or deny; empty: the request fails with UNAVAILABLE and Envoy's failure_mode_deny decides")
	fs.StringVar(&s.recordCosts, "record-costs", config.RecordDescriptorCosts.String(), "which costs are recorded even past the limit (costs reported after they were spent), for rules without record_costs: descriptor (a descriptor's own hits_addend, as Envoy sends apply_on_stream_done costs), always, or never")
	fs.IntVar(&s.maxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors in one request")
	fs.IntVar(&s.maxEntries, "max-entries", service.DefaultMaxEntries, "most entries in one descriptor")
	fs.IntVar(&s.maxRequestBytes, "max-request-bytes", service.DefaultMaxRequestBytes, "largest request, in bytes: a gRPC message past it is refused with RESOURCE_EXHAUSTED, a POST /json body with 413")
	fs.BoolVar(&s.rateLimitHeaders, "ratelimit-headers", false, "add the limit, remaining and reset headers to answers (off: Envoy's enable_x_ratelimit_headers builds its own)")
	fs.StringVar(&s.limitHeader, "ratelimit-limit-header", service.DefaultLimitHeader, "name of the limit header of --ratelimit-headers")
	fs.StringVar(&s.remainingHeader, "ratelimit-remaining-header", service.DefaultRemainingHeader, "name of the remaining header of --ratelimit-headers")
	fs.StringVar(&s.resetHeader, "ratelimit-reset-header", service.DefaultResetHeader, "name of the reset header of --ratelimit-headers")
	fs.BoolVar(&s.mergeDomainConfig, "merge-domain-config", false, "merge config files (or documents) of one domain instead of refusing the second")
	fs.BoolVar(&s.responseDynamicMetadata, "response-dynamic-metadata", false, "fill answers' dynamic_metadata: domain, descriptors, and the metadata of the admitted descriptors' rules")
	fs.BoolVar(&s.quotaMode, "quota-mode", false, "every descriptor in quota mode: a request is denied only when all its quota descriptors are over their limits; a descriptor matching no rule is a quota descriptor that passes, an unlimited one is none")
	fs.BoolVar(&s.shadowMode, "shadow-mode", false, "put every rule in shadow mode: always answer OK, count as usual, log and count would-be denials")
	fs.Float64Var(&s.nearLimitRatio, "near-limit-ratio", 0.8, "share of a limit in use from which an admitted decision counts as near_limit in metrics")
	fs.StringVar(&s.adminAddr, "admin-addr", "", "gRPC listen address of the admin API (ratelimit.admin.v1.Admin: Inspect, Reset; with reflection); empty: off. Keep it private: Reset lifts limits")
	fs.IntVar(&s.maxInFlight, "max-inflight", service.DefaultMaxInFlight, "most rate limit requests worked on at once, each counted once whole; past it, or past a connection's share (max/(n+1) once half are taken), refused with RESOURCE_EXHAUSTED")
	s.memoryLimit = defaultMemoryLimit
	fs.Var(&s.memoryLimit, "memory-limit", "soft limit of the Go heap, as GOMEMLIMIT (which wins when set): near it the GC collects harder, so a flood of large requests does not grow memory past it; 0: none")
	fs.BoolVar(&s.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the HTTP port")
	fs.BoolVar(&s.watchConfig, "watch-config", true, "reload the config when its files change (a bad new config is refused, the old one stays)")
	tlsFlags(fs, s)
	xdsFlags(fs, &s.xds)
	tracingFlags(fs, s)
	return fs
}

// parse reads flags, with RATELIMIT_* environment variables for the flags
// the command line does not set, then envoyproxy/ratelimit's variables for
// the flags neither sets (env.go). The environment is read here, once.
func parse(fs *flag.FlagSet, s *settings, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := "RATELIMIT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", env, e)
			}
			set[f.Name] = true
		}
	})
	if err != nil {
		return err
	}
	plan, err := planEnv(os.LookupEnv, func(name string) bool { return fs.Lookup(name) != nil },
		func(name string) bool { return set[name] })
	if err != nil {
		return err
	}
	for _, v := range plan.values {
		if err := fs.Set(v.flag, v.value); err != nil {
			return fmt.Errorf("%s: %w", v.from, err)
		}
	}
	s.env = plan
	for name := range set {
		s.redisFlagSet = s.redisFlagSet || strings.HasPrefix(name, "redis-")
	}
	return checkRanges(s)
}

// checkRanges refuses flag values out of range, rather than replacing them
// with a default the operator did not ask for.
func checkRanges(s *settings) error {
	for _, c := range []struct {
		bad  bool
		flag string
		val  any
		want string
	}{
		{s.storeTimeout <= 0, "store-timeout", s.storeTimeout, "a duration above 0"},
		{s.denyCache < 0, "deny-cache", s.denyCache, "a duration, 0 for off"},
		{s.shutdownDelay < 0, "shutdown-delay", s.shutdownDelay, "a duration, 0 for none"},
		{s.drainTimeout <= 0, "drain-timeout", s.drainTimeout, "a duration above 0"},
		{s.maxDescriptors <= 0, "max-descriptors", s.maxDescriptors, "a number above 0"},
		{s.maxEntries <= 0, "max-entries", s.maxEntries, "a number above 0"},
		{s.maxRequestBytes <= 0, "max-request-bytes", s.maxRequestBytes, "a positive number of bytes"},
		{s.maxInFlight <= 0, "max-inflight", s.maxInFlight, "a number above 0"},
		{!(s.nearLimitRatio > 0 && s.nearLimitRatio <= 1), "near-limit-ratio", s.nearLimitRatio, "a share above 0 and at most 1"},
		{s.grpcMaxConnAge < 0, "grpc-max-connection-age", s.grpcMaxConnAge, "a duration, 0 for never"},
		{s.grpcMaxConnAgeGrace < 0, "grpc-max-connection-age-grace", s.grpcMaxConnAgeGrace, "a duration, 0 for none"},
		{s.grpcServer != grpcServerLean && s.grpcServer != grpcServerGRPCGo, "grpc-server", s.grpcServer, grpcServerLean + " or " + grpcServerGRPCGo},
		{strings.ContainsAny(s.keyPrefix, "{}"), "key-prefix", s.keyPrefix, "no '{' or '}', which would change the Redis Cluster hash tag"},
		{!strings.HasPrefix(s.metricsPath, "/"), "metrics-path", s.metricsPath, "a path starting with /"},
	} {
		if c.bad {
			return fmt.Errorf("--%s=%v: want %s", c.flag, c.val, c.want)
		}
	}
	return nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && filepath.Base(args[0]) == "ratelimit" {
		// The binary's own path as its first argument: an entrypoint
		// /bin/ratelimit given the command /bin/ratelimit, as envoyproxy/
		// ratelimit's docker-compose does (that binary ignores arguments).
		args = args[1:]
	}
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var s settings
	fs := newFlagSet("ratelimit "+cmd, &s, out)
	if err := parse(fs, &s, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch cmd {
	case "serve":
		return serve(ctx, &s)
	case "validate":
		cfg, err := loadConfig(&s)
		if err != nil {
			return err
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(out, "warning: %s\n", w)
		}
		fmt.Fprintf(out, "%s: %d rules in %d files: ok\n", s.configPath, len(cfg.Rules()), len(cfg.Files()))
		return nil
	}
	return fmt.Errorf("unknown command %q (serve or validate)", cmd)
}

// defaultConfigEnv names the config path of last resort, below --config,
// RATELIMIT_CONFIG and envoyproxy/ratelimit's RUNTIME_* (the image sets it
// to its example rules).
const defaultConfigEnv = "RATELIMIT_DEFAULT_CONFIG"

func loadConfig(s *settings) (*config.Config, error) {
	if s.configPath == "" {
		s.configPath = os.Getenv(defaultConfigEnv)
	}
	if s.configPath == "" {
		return nil, errors.New("--config is required (or envoyproxy/ratelimit's RUNTIME_ROOT)")
	}
	d, err := configDefaults(s)
	if err != nil {
		return nil, err
	}
	return config.Load(s.configPath, d)
}

// configDefaults are the parser's defaults the flags set.
func configDefaults(s *settings) (config.Defaults, error) {
	alg, err := config.ParseAlgorithm(s.defaultAlgorithm)
	if err != nil {
		return config.Defaults{}, fmt.Errorf("--default-algorithm: %w", err)
	}
	fm := config.FailureDefer
	if s.defaultFailureMode != "" {
		if fm, err = config.ParseFailureMode(s.defaultFailureMode); err != nil {
			return config.Defaults{}, fmt.Errorf("--default-failure-mode: %w, or empty to defer to Envoy", err)
		}
	}
	rc, err := config.ParseCostRecording(s.recordCosts)
	if err != nil {
		return config.Defaults{}, fmt.Errorf("--record-costs: %w", err)
	}
	return config.Defaults{Algorithm: alg, FailureMode: fm, RecordCosts: rc, MergeDomains: s.mergeDomainConfig}, nil
}

// logWarnings logs what a config holds that loads but has no effect.
func logWarnings(log *zap.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("config: "+w, zap.String("hash", cfg.Hash()))
	}
}

func newLogger(s *settings) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(s.logLevel)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var zc zap.Config
	switch s.logFormat {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true // a warning is not a bug: keep the terminal readable
	default:
		return nil, fmt.Errorf("--log-format: %q is not json or console", s.logFormat)
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	// A client can make every request log (over-limit shadows, refused
	// costs): past 100 of one message per second, keep 1 in 100.
	zc.Sampling = &zap.SamplingConfig{Initial: 100, Thereafter: 100}
	return zc.Build()
}

// streamWorkersPerCore sizes the gRPC server's pool of stream workers (see
// newGRPCServer).
const streamWorkersPerCore = 8

// storeReadyWait bounds how long serve waits for the store at start.
const storeReadyWait = 3 * time.Second

// serve provisions every part, validates it, then serves until ctx ends and
// drains.
func serve(ctx context.Context, s *settings) error {
	log, err := newLogger(s)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit
	logEnv(log, s.env)

	cfg, xds, err := startConfig(ctx, s, log) // see xds.go: cfg is nil over xDS until xds.first
	if err != nil {
		return err
	}
	defer xds.close()
	log.Info("memory", zap.Int64("soft_limit_bytes", setRuntimeDefaults(int64(s.memoryLimit))))

	grpcTLS, redisTLS, err := tlsSettings(s, log)
	if err != nil {
		return err
	}
	if s.redisURL == "" && s.redisClusterURL == "" && s.redisSentinelURL == "" && s.redisSettings() {
		// Each replica would count alone: limits N times too loose, silently.
		return errors.New("a Redis setting is given but no Redis URL (--redis-url, --redis-cluster-url, --redis-sentinel-url, REDIS_URL): refusing to start on the embedded store")
	}
	if s.redisURL != "" && !strings.Contains(s.redisURL, "://") {
		// host:port or a socket path, as envoyproxy/ratelimit's REDIS_URL.
		if s.redisURL, err = singleURL(s.redisURL, "", "redis", "", false); err != nil {
			return fmt.Errorf("--redis-url: %w (or a redis://, rediss:// or unix:// URL)", err)
		}
	}
	store, err := limiter.OpenStore(limiter.StoreConfig{
		URL: s.redisURL, ClusterURL: s.redisClusterURL, SentinelURL: s.redisSentinelURL, TLS: redisTLS,
	})
	if err != nil {
		return err
	}
	defer store.Close()
	if store.Mode == "embedded" {
		log.Warn("embedded store: an in-process miniredis, one replica, not shared with other instances, not persistent; use --redis-url in production")
	} else {
		log.Info("store", zap.String("mode", store.Mode))
	}

	registry := prometheus.NewRegistry()
	m := metrics.New(registry)
	denyCache := s.denyCache
	if denyCache == 0 {
		denyCache = -1 // the flag's 0 means off; the option's 0 means its default
	}
	lim := limiter.New(store.Client, &limiter.Options{
		Timeout:    s.storeTimeout,
		DenyCache:  denyCache,
		Observe:    func(d time.Duration, err error) { m.StoreCall(d, limiter.ErrorKind(err)) },
		Overloaded: m.Overloaded,
	})
	defer lim.Close()
	// Connections open and the decide code loaded before the service says
	// it is ready, so the first requests pay no setup. A store that is not
	// reachable yet does not hold the service back: rules answer by their
	// failure mode until it is, and calls load the code when they can.
	// A store that refuses the credentials is a setting to fix: the
	// service is not ready until it accepts them (see awaitCredentials).
	var credentialsRefused atomic.Bool
	prepareCtx, cancel := context.WithTimeout(ctx, storeReadyWait)
	if err := lim.Prepare(prepareCtx); limiter.AuthRefused(err) {
		credentialsRefused.Store(true)
		log.Error("Redis refused the credentials: not ready until it accepts them", zap.Error(err))
	} else if err != nil {
		log.Warn("store not ready: rules answer by their failure_mode until it is", zap.Error(err))
	}
	cancel()
	if xds != nil {
		if cfg, err = xds.first(ctx); cfg == nil {
			return err // nil when ctx ended first: a stop before the start
		}
	}
	svc := service.New(cfg, lim, &service.Options{
		MaxDescriptors:   s.maxDescriptors,
		MaxEntries:       s.maxEntries,
		MaxRequestBytes:  s.maxRequestBytes,
		RateLimitHeaders: s.rateLimitHeaders,
		ShadowMode:       s.shadowMode,
		NearLimitRatio:   s.nearLimitRatio,
		Logger:           log,
		Metrics:          m,

		LimitHeader:             s.limitHeader,
		RemainingHeader:         s.remainingHeader,
		ResetHeader:             s.resetHeader,
		QuotaMode:               s.quotaMode,
		ResponseDynamicMetadata: s.responseDynamicMetadata,
		KeyPrefix:               s.keyPrefix,
	})
	if s.shadowMode {
		log.Warn("global shadow mode: every answer is OK; would-be denials are logged and counted")
	}
	if xds != nil {
		xds.attach(svc)
	} else if s.watchConfig {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		defaults := cfg.Defaults()
		go func() {
			err := config.Watch(watchCtx, s.configPath, defaults, config.DefaultDebounce,
				func(c *config.Config) {
					if svc.Reload(c) {
						logWarnings(log, c)
					}
				}, svc.ReloadFailed)
			if err != nil {
				log.Error("config watch stopped: reloads need a restart", zap.Error(err))
			}
		}()
	}

	lns, err := listen(s)
	if err != nil {
		return err
	}
	grpcLn, httpLn, adminLn, debugLn, metricsLn := lns[0], lns[1], lns[2], lns[3], lns[4]

	shedder := service.NewShedder(s.maxInFlight, m)
	// The interceptors keep envoyproxy/ratelimit's total_requests and
	// response_time, refuse calls while xDS has given no config yet, and
	// trace calls with --tracing.
	traceInterceptor, stopTracing, err := startTracing(ctx, s)
	if err != nil {
		return err
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flushCtx); err != nil {
			log.Warn("tracing: spans not flushed", zap.Error(err))
		}
	}()
	interceptors := []grpc.UnaryServerInterceptor{m.UnaryServerInterceptor()}
	if xdsInterceptor := xds.interceptor(); xdsInterceptor != nil {
		interceptors = append([]grpc.UnaryServerInterceptor{xdsInterceptor}, interceptors...)
	}
	if traceInterceptor != nil {
		interceptors = append(interceptors, traceInterceptor)
		log.Info("tracing gRPC calls", zap.String("protocol", s.tracingProtocol), zap.Float64("sampling_rate", s.tracingSamplingRate))
	}
	// The gRPC port is served by grpcunary unless --grpc-server says
	// grpc-go (grpcserver.go); the admin port keeps grpc-go either way.
	grpcServer, err := newGRPCServer(s, grpcTLS, svc.Codec(), shedder, interceptors)
	if err != nil {
		return err
	}
	rlsv3.RegisterRateLimitServiceServer(grpcServer, svc)
	healthServer := health.NewServer()
	healthpb.RegisterHealthServer(grpcServer, healthServer)
	reflection.Register(grpcServer)

	var draining atomic.Bool
	ready := func() error {
		switch {
		case draining.Load():
			return errors.New("draining")
		case credentialsRefused.Load():
			return errors.New("Redis refuses the credentials")
		}
		return nil
	}
	// A client gets 5 s for its headers and 10 s for the whole request, so
	// that a body sent slowly, or never, does not hold its connection for
	// long (it holds no --max-inflight place: Shedder.Handler takes one
	// once the body has come); idle keep-alive connections close after a
	// minute. Each connection gets its own hold on the shedder's places,
	// so that no one client of POST /json takes them all.
	httpServer := &http.Server{
		Handler:           httpHandler(ready, svc, shedder, s.maxRequestBytes, registry, s.pprof),
		ConnContext:       shedder.ConnContext,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       time.Minute,
	}

	errc := make(chan error, 5)
	go func() { errc <- grpcServer.Serve(grpcLn) }()
	go func() { errc <- httpServer.Serve(httpLn) }()
	// The debug and metrics ports of envoyproxy/ratelimit: read-only.
	var extraServers []*http.Server
	for _, side := range []struct {
		ln      net.Listener
		handler http.Handler
		what    string
	}{
		{debugLn, debugHandler(svc, s.pprof), "debug"},
		{metricsLn, metricsHandler(registry, s.metricsPath), "metrics"},
	} {
		if side.ln == nil {
			continue
		}
		srv := &http.Server{Handler: side.handler, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
		extraServers = append(extraServers, srv)
		go func() { errc <- srv.Serve(side.ln) }()
		log.Info(side.what+" port serving", zap.String("addr", side.ln.Addr().String()))
	}
	// The admin API has its own server, so that its address, not a
	// certificate, decides who may reset limits; it takes the same TLS.
	var adminServer *grpc.Server
	if adminLn != nil {
		adminOpts := []grpc.ServerOption{grpc.WaitForHandlers(true)}
		if grpcTLS != nil {
			adminOpts = append(adminOpts, grpc.Creds(credentials.NewTLS(grpcTLS)))
		}
		adminServer = grpc.NewServer(adminOpts...)
		service.RegisterAdmin(adminServer, service.NewAdmin(svc, lim))
		reflection.Register(adminServer)
		go func() { errc <- adminServer.Serve(adminLn) }()
		log.Info("admin API serving: keep this address private, Reset lifts limits", zap.String("addr", adminLn.Addr().String()))
	}
	setHealth := func(st healthpb.HealthCheckResponse_ServingStatus) {
		// "ratelimit" is the name envoyproxy/ratelimit reports under.
		for _, name := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"} {
			healthServer.SetServingStatus(name, st)
		}
	}
	if credentialsRefused.Load() {
		setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
		go awaitCredentials(ctx, lim, log, func() {
			credentialsRefused.Store(false)
			setHealth(healthpb.HealthCheckResponse_SERVING) // a no-op once the health server is shut down
		})
	} else {
		setHealth(healthpb.HealthCheckResponse_SERVING)
	}
	log.Info("serving", zap.String("grpc", grpcLn.Addr().String()), zap.String("grpc server", s.grpcServer), zap.String("http", httpLn.Addr().String()))

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining", zap.Duration("deadline", s.drainTimeout))
	case serveErr = <-errc:
		log.Error("server failed", zap.Error(serveErr))
	}

	draining.Store(true)
	healthServer.Shutdown() // NOT_SERVING for every service
	if s.shutdownDelay > 0 && serveErr == nil {
		log.Info("not serving: waiting before the drain", zap.Duration("delay", s.shutdownDelay))
		time.Sleep(s.shutdownDelay)
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), s.drainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		grpcServer.GracefulStop()
		if adminServer != nil {
			adminServer.GracefulStop()
		}
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-drainCtx.Done():
		log.Warn("drain deadline passed: closing remaining streams")
		grpcServer.Stop()
		if adminServer != nil {
			adminServer.Stop()
		}
		<-stopped
	}
	for _, srv := range append(extraServers, httpServer) {
		if err := srv.Shutdown(drainCtx); err != nil {
			srv.Close()
		}
	}
	log.Info("stopped")
	return serveErr
}

// httpHandler serves the HTTP port: liveness and readiness for probes that
// speak HTTP (envoyproxy/ratelimit's /healthcheck among them), Prometheus
// metrics, the config in force, and the JSON API. ready says why the
// service is not ready, nil when it is.
func httpHandler(ready func() error, svc *service.Service, shedder *service.Shedder, maxBody int, registry *prometheus.Registry, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	if withPprof {
		addPprof(mux)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	mux.Handle("GET /rlconfig", svc.ConfigHandler())
	mux.Handle("/json", shedder.Handler(svc.JSONHandler(), maxBody))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	// As envoyproxy/ratelimit answers it: OK, or a 500 when not ready.
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "OK")
	})
	return mux
}

func addPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// debugHandler serves the debug port as envoyproxy/ratelimit's: /rlconfig
// as text (egctl reads it), an index at /, and the profiler with --pprof
// (the reference serves it always).
func debugHandler(svc *service.Service, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	endpoints := "/rlconfig: print out the currently loaded configuration for debugging\n"
	if withPprof {
		addPprof(mux)
		endpoints += "/debug/pprof/: root of various pprof endpoints. hit for help.\n"
	}
	mux.Handle("GET /rlconfig", svc.ConfigTextHandler())
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, endpoints) })
	return mux
}

// metricsHandler serves the metrics alone at path, as envoyproxy/ratelimit's
// PROMETHEUS_ADDR port does.
func metricsHandler(registry *prometheus.Registry, path string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(path, promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	return mux
}

// listen opens the listeners: gRPC, HTTP, then admin, debug and metrics
// (nil when off). On an error, those already open are closed.
func listen(s *settings) ([]net.Listener, error) {
	var lns []net.Listener
	for _, l := range []struct {
		addr, flag string
		optional   bool
	}{
		{s.grpcAddr, "grpc-addr", false}, {s.httpAddr, "http-addr", false}, {s.adminAddr, "admin-addr", true},
		{s.debugAddr, "debug-addr", true}, {s.metricsAddr, "metrics-addr", true},
	} {
		if l.optional && l.addr == "" {
			lns = append(lns, nil)
			continue
		}
		network, addr := "tcp", l.addr
		if path, ok := strings.CutPrefix(addr, "unix:"); ok && l.flag == "grpc-addr" {
			network, addr = "unix", path
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			for _, open := range lns {
				if open != nil {
					open.Close()
				}
			}
			return nil, fmt.Errorf("--%s: %w", l.flag, err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// awaitCredentials asks the store again, every credentialsRetry, until it
// accepts the credentials (or fails otherwise: then the rules' failure
// modes answer, as for a store that is down), then calls accepted.
func awaitCredentials(ctx context.Context, lim *limiter.Limiter, log *zap.Logger, accepted func()) {
	t := time.NewTicker(credentialsRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, storeReadyWait)
		err := lim.Prepare(pctx)
		cancel()
		if limiter.AuthRefused(err) || ctx.Err() != nil {
			continue
		}
		log.Info("Redis accepts the credentials: ready")
		accepted()
		return
	}
}

// credentialsRetry is how often a store that refused the credentials is
// asked again.
const credentialsRetry = 2 * time.Second

// logEnv logs, once, what envoyproxy/ratelimit's environment did.
func logEnv(log *zap.Logger, p *envPlan) {
	if p == nil {
		return
	}
	for _, v := range p.values {
		log.Info("from envoyproxy/ratelimit's environment", zap.String("flag", "--"+v.flag), zap.String("from", v.from))
	}
	for _, n := range p.notes {
		if n.warn {
			log.Warn(n.msg, zap.Strings("variables", n.vars))
		} else {
			log.Info(n.msg, zap.Strings("variables", n.vars))
		}
	}
}

// redisSettings reports a Redis setting: a --redis-* flag or RATELIMIT_REDIS_*
// variable, or one of envoyproxy/ratelimit's REDIS_* variables.
func (s *settings) redisSettings() bool {
	return s.redisFlagSet || s.env != nil && s.env.redis
}
