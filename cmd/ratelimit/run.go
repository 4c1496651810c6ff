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
	"strings"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/metrics"
	"github.com/slidingwindow/ratelimit/pkg/service"
)

const usage = `usage:
  ratelimit [serve] [flags]            serve the rate limit service
  ratelimit validate --config PATH     check a config and exit

Every flag can also be set as RATELIMIT_<NAME> in the environment, e.g.
RATELIMIT_REDIS_URL for --redis-url; a flag on the command line wins.

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
	nearLimitRatio          float64
	watchConfig             bool
	adminAddr               string
	maxInFlight             int
	memoryLimit             byteSize
	pprof                   bool

	// Config over xDS, see xds.go.
	xds xdsSettings

	// TLS, see tls.go.
	grpcTLSCert, grpcTLSKey, grpcTLSClientCA                  string
	redisTLSCA, redisTLSCert, redisTLSKey, redisTLSServerName string
}

func newFlagSet(name string, s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&s.configPath, "config", "", "config file, or directory of *.yaml / *.yml files (required, unless --config-type GRPC_XDS_SOTW)")
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "gRPC listen address (rate limit service, health, reflection)")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "HTTP listen address: /healthz, /readyz, /metrics, /rlconfig, POST /json")
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
	fs.IntVar(&s.maxInFlight, "max-inflight", service.DefaultMaxInFlight, "most rate limit requests worked on at once; past it requests are refused at once with RESOURCE_EXHAUSTED")
	s.memoryLimit = defaultMemoryLimit
	fs.Var(&s.memoryLimit, "memory-limit", "soft limit of the Go heap, as GOMEMLIMIT (which wins when set): near it the GC collects harder, so a flood of large requests does not grow memory past it; 0: none")
	fs.BoolVar(&s.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the HTTP port")
	fs.BoolVar(&s.watchConfig, "watch-config", true, "reload the config when its files change (a bad new config is refused, the old one stays)")
	tlsFlags(fs, s)
	xdsFlags(fs, &s.xds)
	return fs
}

// parse reads flags, with RATELIMIT_* environment variables for the flags
// the command line does not set. The environment is read here, once.
func parse(fs *flag.FlagSet, args []string) error {
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
		}
	})
	return err
}

func run(ctx context.Context, args []string, out io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var s settings
	fs := newFlagSet("ratelimit "+cmd, &s, out)
	if err := parse(fs, args); err != nil {
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

func loadConfig(s *settings) (*config.Config, error) {
	if s.configPath == "" {
		return nil, errors.New("--config is required")
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

	if s.maxRequestBytes <= 0 {
		return fmt.Errorf("--max-request-bytes: %d is not a positive number of bytes", s.maxRequestBytes)
	}
	cfg, xds, err := startConfig(ctx, s, log) // see xds.go: cfg is nil over xDS until xds.first
	if err != nil {
		return err
	}
	defer xds.close()
	log.Info("memory", zap.Int64("soft_limit_bytes", setRuntimeDefaults(int64(s.memoryLimit))))

	grpcOpts, redisTLS, err := tlsSettings(s, log)
	if err != nil {
		return err
	}
	grpcOpts = append(grpcOpts, xds.serverOptions()...)
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
	prepareCtx, cancel := context.WithTimeout(ctx, storeReadyWait)
	if err := lim.Prepare(prepareCtx); err != nil {
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

	grpcLn, err := net.Listen("tcp", s.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	httpLn, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		grpcLn.Close()
		return fmt.Errorf("--http-addr: %w", err)
	}
	var adminLn net.Listener
	if s.adminAddr != "" {
		if adminLn, err = net.Listen("tcp", s.adminAddr); err != nil {
			grpcLn.Close()
			httpLn.Close()
			return fmt.Errorf("--admin-addr: %w", err)
		}
	}

	shedder := service.NewShedder(s.maxInFlight, m)
	// WaitForHandlers: a stop waits for handlers to return, so the limiter
	// is closed only after the calls that use it.
	// The codec decodes rate limit requests whatever bytes their values
	// hold; the tap refuses calls past --max-inflight before reading them.
	// As many stream workers as calls may be in flight: each call runs on
	// a goroutine whose stack has already grown, not a new one (measured in
	// make bench: 6-12 % less service CPU per decision).
	workers := s.maxInFlight
	if workers <= 0 {
		workers = service.DefaultMaxInFlight
	}
	grpcServer := grpc.NewServer(append(grpcOpts, grpc.WaitForHandlers(true),
		grpc.ForceServerCodecV2(svc.Codec()), grpc.MaxRecvMsgSize(s.maxRequestBytes), grpc.InTapHandle(shedder.TapHandle()),
		grpc.NumStreamWorkers(uint32(workers)))...)
	rlsv3.RegisterRateLimitServiceServer(grpcServer, svc)
	healthServer := health.NewServer()
	healthpb.RegisterHealthServer(grpcServer, healthServer)
	reflection.Register(grpcServer)

	var draining atomic.Bool
	// A client gets 5 s for its headers and 10 s for the whole request, so
	// that a body sent slowly, or never, cannot hold a --max-inflight place
	// for long; idle keep-alive connections close after a minute.
	httpServer := &http.Server{
		Handler:           httpHandler(&draining, svc, shedder, registry, s.pprof),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       time.Minute,
	}

	errc := make(chan error, 3)
	go func() { errc <- grpcServer.Serve(grpcLn) }()
	go func() { errc <- httpServer.Serve(httpLn) }()
	// The admin API has its own server, so that its address, not a
	// certificate, decides who may reset limits; it takes the same TLS.
	var adminServer *grpc.Server
	if adminLn != nil {
		adminServer = grpc.NewServer(append(grpcOpts, grpc.WaitForHandlers(true))...)
		service.RegisterAdmin(adminServer, service.NewAdmin(svc, lim))
		reflection.Register(adminServer)
		go func() { errc <- adminServer.Serve(adminLn) }()
		log.Info("admin API serving: keep this address private, Reset lifts limits", zap.String("addr", adminLn.Addr().String()))
	}
	healthServer.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthServer.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	log.Info("serving", zap.String("grpc", grpcLn.Addr().String()), zap.String("http", httpLn.Addr().String()))

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
	if err := httpServer.Shutdown(drainCtx); err != nil {
		httpServer.Close()
	}
	log.Info("stopped")
	return serveErr
}

// httpHandler serves the HTTP port: liveness and readiness for probes that
// speak HTTP, Prometheus metrics, the config in force, and the JSON API.
func httpHandler(draining *atomic.Bool, svc *service.Service, shedder *service.Shedder, registry *prometheus.Registry, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	mux.Handle("GET /rlconfig", svc.ConfigHandler())
	mux.Handle("/json", shedder.Handler(svc.JSONHandler()))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}
