// Package app assembles the rate limit service from its settings: New
// provisions and checks every part (logger, config source, store, limiter,
// service, TLS, listeners, tracing, memory limit), Run serves until its
// context ends, then drains. Main is the ratelimit command.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

// ErrStopped is New's error when its context ended before the service
// could start: over xDS, before the first config came. It is no failure.
var ErrStopped = errors.New("stopped before the start")

// App is the service, provisioned: Run serves it, once.
type App struct {
	s        *settings.Settings
	log      *zap.Logger
	lim      *limiter.Limiter
	svc      *service.Service
	registry *prometheus.Registry
	shedder  *service.Shedder
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
// its log tells: the config (over xDS, it waits for the first one, until
// ctx ends: then ErrStopped), the store, the service, the listeners. ctx
// bounds the background work too (the config source, the store's setup).
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

	cfg, xds, err := startConfig(ctx, s, log) // see sources.go: cfg is nil over xDS until xds.first
	if err != nil {
		return nil, err
	}
	a.onClose(xds.close)
	log.Info("memory", zap.Int64("soft_limit_bytes", setRuntimeDefaults(int64(s.MemoryLimit))))

	grpcTLS, redisTLS, err := tlsSettings(s, log)
	if err != nil {
		return nil, err
	}
	a.grpcTLS = grpcTLS
	store, err := openStore(s, redisTLS, log)
	if err != nil {
		return nil, err
	}
	a.onClose(func() { store.Close() })
	a.registry = prometheus.NewRegistry()
	m := metrics.New(a.registry)
	a.lim = newLimiter(s, store, m)
	a.onClose(a.lim.Close)
	a.credentialsRefused.Store(prepare(ctx, a.lim, log))
	if xds != nil {
		if cfg, err = xds.first(ctx); cfg == nil && err == nil {
			return nil, ErrStopped
		} else if err != nil {
			return nil, err
		}
	}
	a.svc = service.New(cfg, a.lim, &service.Options{
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
	})
	if s.ShadowMode {
		log.Warn("global shadow mode: every answer is OK; would-be denials are logged and counted")
	}
	followCtx, stopFollowing := context.WithCancel(ctx)
	a.onClose(stopFollowing)
	followConfig(followCtx, s, log, cfg, xds, a.svc)

	if a.lns, err = listen(s); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			a.lns.close()
		}
	}()
	a.shedder = service.NewShedder(s.MaxInFlight, m)
	// The interceptors keep envoyproxy/ratelimit's total_requests and
	// response_time, refuse calls while xDS has given no config yet, and
	// trace calls with --tracing.
	traceInterceptor, stopTracing, err := startTracing(ctx, &s.Tracing)
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
	interceptors := []grpc.UnaryServerInterceptor{m.UnaryServerInterceptor()}
	if xdsInterceptor := xds.interceptor(); xdsInterceptor != nil {
		interceptors = append([]grpc.UnaryServerInterceptor{xdsInterceptor}, interceptors...)
	}
	if traceInterceptor != nil {
		interceptors = append(interceptors, traceInterceptor)
		log.Info("tracing gRPC calls", zap.String("protocol", s.Tracing.ExporterProtocol), zap.Float64("sampling_rate", s.Tracing.SamplingRate))
	}
	// The gRPC port is served by grpcunary unless --grpc-server says
	// grpc-go (grpcserver.go); the admin port keeps grpc-go either way.
	if a.grpc, err = newGRPCServer(s, grpcTLS, a.svc.Codec(), a.shedder, interceptors); err != nil {
		return nil, err
	}
	rlsv3.RegisterRateLimitServiceServer(a.grpc, a.svc)
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

// ready says why the service is not ready, nil when it is.
func (a *App) ready() error {
	switch {
	case a.draining.Load():
		return errors.New("draining")
	case a.credentialsRefused.Load():
		return errors.New("Redis refuses the credentials")
	}
	return nil
}

// setHealth reports st for every name the service answers health checks
// under: "ratelimit" is the name envoyproxy/ratelimit reports under.
func (a *App) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"} {
		a.health.SetServingStatus(name, st)
	}
}

// Run serves until ctx ends or a server fails, then drains: health turns
// NOT_SERVING, the service goes on answering for --shutdown-delay, then
// in-flight calls get --drain-timeout. It releases everything New
// provisioned, and returns the error of the server that failed, if any.
func (a *App) Run(ctx context.Context) error {
	defer a.close()
	s, log, lns := a.s, a.log, a.lns
	// A client gets 5 s for its headers and 10 s for the whole request, so
	// that a body sent slowly, or never, does not hold its connection for
	// long (it holds no --max-inflight place: Shedder.Handler takes one
	// once the body has come); idle keep-alive connections close after a
	// minute. Each connection gets its own hold on the shedder's places,
	// so that no one client of POST /json takes them all.
	httpServer := &http.Server{
		Handler:           httpHandler(a.ready, a.svc, a.shedder, s.MaxRequestBytes, a.registry, s.Pprof),
		ConnContext:       a.shedder.ConnContext,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       time.Minute,
	}

	errc := make(chan error, 5)
	go func() { errc <- a.grpc.Serve(lns.GRPC) }()
	go func() { errc <- httpServer.Serve(lns.HTTP) }()
	// The debug and metrics ports of envoyproxy/ratelimit: read-only.
	var extraServers []*http.Server
	for _, side := range []struct {
		ln      net.Listener
		handler http.Handler
		what    string
	}{
		{lns.Debug, debugHandler(a.svc, s.Pprof), "debug"},
		{lns.Metrics, metricsHandler(a.registry, s.MetricsPath), "metrics"},
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
	if lns.Admin != nil {
		adminOpts := []grpc.ServerOption{grpc.WaitForHandlers(true)}
		if a.grpcTLS != nil {
			adminOpts = append(adminOpts, grpc.Creds(credentials.NewTLS(a.grpcTLS)))
		}
		adminServer = grpc.NewServer(adminOpts...)
		service.RegisterAdmin(adminServer, service.NewAdmin(a.svc, a.lim))
		reflection.Register(adminServer)
		go func() { errc <- adminServer.Serve(lns.Admin) }()
		log.Info("admin API serving: keep this address private, Reset lifts limits", zap.String("addr", lns.Admin.Addr().String()))
	}
	if a.credentialsRefused.Load() {
		a.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
		go awaitCredentials(ctx, a.lim, log, func() {
			a.credentialsRefused.Store(false)
			a.setHealth(healthpb.HealthCheckResponse_SERVING) // a no-op once the health server is shut down
		})
	} else {
		a.setHealth(healthpb.HealthCheckResponse_SERVING)
	}
	log.Info("serving", zap.String("grpc", lns.GRPC.Addr().String()), zap.String("grpc server", s.GRPCServer),
		zap.String("http", lns.HTTP.Addr().String()))

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining", zap.Duration("deadline", s.DrainTimeout))
	case serveErr = <-errc:
		log.Error("server failed", zap.Error(serveErr))
	}

	a.draining.Store(true)
	a.health.Shutdown() // NOT_SERVING for every service
	if s.ShutdownDelay > 0 && serveErr == nil {
		log.Info("not serving: waiting before the drain", zap.Duration("delay", s.ShutdownDelay))
		time.Sleep(s.ShutdownDelay)
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), s.DrainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		a.grpc.GracefulStop()
		if adminServer != nil {
			adminServer.GracefulStop()
		}
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-drainCtx.Done():
		log.Warn("drain deadline passed: closing remaining streams")
		a.grpc.Stop()
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
