// Package app assembles the rate limit service from its settings: New
// provisions and checks every part (logger, config source, store, limiter,
// service, TLS, listeners, tracing, memory limit, statsd), Run serves until its
// context ends, then drains. Main is the ratelimit command.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/slidingwindow/ratelimit/internal/hotkeys"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/statsd"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// ErrStopped is New's error when its context ended before the service
// could start: over xDS, before the first config came. It is no failure.
var ErrStopped = errors.New("stopped before the start")

// App is the service, provisioned: Run serves it, once.
type App struct {
	s        *settings.Settings
	log      *zap.Logger
	lim      *limiter.Split
	slices   *hotkeys.Slices // ShouldRateLimit's and the admin API's way to lim
	rlqs     *service.RLQS
	svc      *service.Service
	registry *prometheus.Registry
	stats    *statsd.Sender // nil without --statsd-addr
	shedder  *transport.Shedder
	grpcTLS  *tls.Config
	lns      *listeners
	grpc     grpcPortServer
	health   *health.Server

	credentialsRefused atomic.Bool
	draining           atomic.Bool

	// closers release what New provisioned, last first: at the end of Run,
	// or when New fails.
	closers []func()
}

// New provisions the service that s describes and checks it, in the order
// its log tells: the config source, the store, the first config (over xDS
// it waits for it, until ctx ends: then ErrStopped), the service, the
// listeners. ctx bounds the background work too (the config source, the
// store's setup).
func New(ctx context.Context, s *settings.Settings) (_ *App, err error) {
	if err := settings.Validate(s); err != nil {
		return nil, err
	}
	log, err := newLogger(s)
	if err != nil {
		return nil, err
	}
	a := &App{s: s, log: log}
	a.onClose(func() { _ = log.Sync() }) // nothing to do about a failed flush at exit
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	logEnv(log, s.Reference)

	src, err := openSource(ctx, s, log)
	if err != nil {
		return nil, err
	}
	a.onClose(func() { _ = src.Close() }) // a source's Close only frees
	log.Info("memory", zap.Int64("soft_limit_bytes", setRuntimeDefaults(int64(s.MemoryLimit))))

	grpcTLS, redisTLS, err := tlsSettings(s, log)
	if err != nil {
		return nil, err
	}
	a.grpcTLS = grpcTLS
	// Tracing starts before the limiter, whose Redis batches it traces too;
	// it stops (flushing their spans) after the limiter closed.
	tracerProvider, traceInterceptor, stopTracing, err := startTracing(ctx, &s.Tracing)
	if err != nil {
		return nil, err
	}
	a.onClose(func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flushCtx); err != nil {
			log.Warn("tracing: spans not flushed", zap.Error(err))
		}
	})
	store, err := openStore(s, redisTLS, log)
	if err != nil {
		return nil, err
	}
	a.onClose(func() { _ = store.Close() }) // at close, a connection that fails to close leaves nothing to undo
	perSecondStore, err := openPerSecondStore(s, redisTLS, log)
	if err != nil {
		return nil, err
	}
	var perSecond *limiter.Limiter
	// now is the one local clock of decisions: the window the reference's
	// keys name (the service's Options.Now) and the limiters' deny caches.
	// Redis TIME decides the rest (see package limiter).
	now := time.Now
	a.registry = prometheus.NewRegistry()
	var stats metrics.Stats
	if a.stats, stats, err = openStats(s, log); err != nil {
		return nil, err
	}
	m := metrics.NewWithStats(a.registry, stats)
	if perSecondStore != nil {
		a.onClose(func() { _ = perSecondStore.Close() }) // as the main store's
		perSecond = newLimiter(s, perSecondStore, m, tracerProvider, now)
	}
	main := newLimiter(s, store, m, tracerProvider, now)
	a.lim = limiter.NewSplit(main, perSecond)
	a.onClose(a.lim.Close)
	// The store gets ready (connections open, code loaded) while the
	// source brings the first config, which over xDS may take long; a bad
	// config file cuts that short.
	prepareCtx, stopPreparing := context.WithCancel(ctx)
	defer stopPreparing()
	prepared := make(chan bool, 1)
	go func() { prepared <- prepare(prepareCtx, a.lim, log) }()
	cfg, err := src.First(ctx)
	if err != nil || cfg == nil {
		stopPreparing() // no service will start: its store's setup is moot
	}
	a.credentialsRefused.Store(<-prepared)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return nil, ErrStopped
	}
	// Hot keys are decided from slices of their limits, leased from the
	// counters ShouldRateLimit decides on; RLQS goes to the counters
	// themselves, the admin API through the slices (a Reset drops them).
	threshold := s.HotKeyThreshold
	if threshold == 0 {
		threshold = -1 // off
	}
	warm := s.HotKeyWarmThreshold
	if warm == 0 {
		warm = -1 // off
	}
	a.slices = hotkeys.NewSlices(a.lim, &hotkeys.SliceOptions{
		Threshold: threshold, WarmThreshold: warm, Period: s.HotKeySlicePeriod, Now: now, Observe: m.SliceObserver(),
	})
	a.onClose(a.slices.Close) // before the limiters close: it gives back what the slices did not use
	var decider service.Decider = a.slices
	if s.Region != "" {
		if decider, err = openRegions(s, redisTLS, a, main, m, tracerProvider, now, log); err != nil {
			return nil, err
		}
	}
	a.svc = service.New(cfg, decider, &service.Options{
		MaxDescriptors:   s.MaxDescriptors,
		MaxEntries:       s.MaxEntries,
		MaxRequestBytes:  s.MaxRequestBytes,
		RateLimitHeaders: s.RateLimitHeaders,
		ShadowMode:       s.ShadowMode,
		NearLimitRatio:   s.NearLimitRatio,
		Logger:           log,
		Metrics:          m,

		LimitHeader:             s.LimitHeader,
		RemainingHeader:         s.RemainingHeader,
		ResetHeader:             s.ResetHeader,
		QuotaMode:               s.QuotaMode,
		ResponseDynamicMetadata: s.ResponseDynamicMetadata,
		KeyPrefix:               s.KeyPrefix,
		Now:                     now,
	})
	if s.ShadowMode {
		log.Warn("global shadow mode: every answer is OK; would-be denials are logged and counted")
	}
	src.Follow(ctx, a.svc)

	if a.lns, err = listen(s); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			a.lns.close()
		}
	}()
	// Past --max-connections a connection is closed at accept: what each
	// may make the server hold is bounded, and so their number.
	m.TransportRefusals(transport.RefusedConnection)
	a.lns.GRPC = transport.LimitListener(a.lns.GRPC, s.MaxConnections, m)
	a.shedder = transport.NewShedder(s.MaxInFlight, m)
	// The interceptors keep envoyproxy/ratelimit's total_requests and
	// response_time, refuse calls while xDS has given no config yet, and
	// trace calls with --tracing.
	interceptors := []grpc.UnaryServerInterceptor{m.UnaryServerInterceptor()}
	if !src.Configured() { // it will be, and then stays so
		interceptors = append([]grpc.UnaryServerInterceptor{unconfigured(src)}, interceptors...)
	}
	if traceInterceptor != nil {
		interceptors = append(interceptors, traceInterceptor)
		log.Info("tracing gRPC calls", zap.String("protocol", s.Tracing.ExporterProtocol), zap.Float64("sampling_rate", s.Tracing.SamplingRate))
	}
	// The gRPC port is served by grpcunary unless --grpc-server says
	// grpc-go (grpcserver.go); the admin port keeps grpc-go either way. Its
	// codec decodes within the bounds the service validates against.
	codec := transport.NewCodec(s.MaxDescriptors, s.MaxEntries)
	if a.grpc, err = newGRPCServer(s, grpcTLS, codec, a.shedder, m, interceptors); err != nil {
		return nil, err
	}
	rlsv3.RegisterRateLimitServiceServer(a.grpc, a.svc)
	// The Rate Limit Quota Service leases from the same counters.
	alloc := rlqs.New(a.lim, &rlqs.Options{ReportInterval: s.RLQSReportInterval, Lease: s.RLQSLease})
	a.rlqs = service.NewRLQS(a.svc, alloc)
	rlqsv3.RegisterRateLimitQuotaServiceServer(a.grpc, a.rlqs)
	a.health = health.NewServer()
	healthpb.RegisterHealthServer(a.grpc, a.health)
	reflection.Register(a.grpc)
	return a, nil
}

// onClose adds f to what close releases.
func (a *App) onClose(f func()) { a.closers = append(a.closers, f) }

// close releases what New provisioned, last first.
func (a *App) close() {
	for _, f := range slices.Backward(a.closers) {
		f()
	}
	a.closers = nil
}
