package app

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/slidingwindow/ratelimit/internal/service"
)

// ready says why the service is not ready, nil when it is.
func (a *App) ready() error {
	switch {
	case a.draining.Load():
		return errors.New("draining")
	case a.credentialsRefused.Load():
		return errors.New("Redis refuses the credentials") //nolint:staticcheck // ST1005: "Redis" is a name, and the text is /readyz's answer
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
	// Work started here ends with Run, before what it uses is released.
	background, stopBackground := context.WithCancel(ctx)
	var backgroundWork sync.WaitGroup
	defer func() {
		stopBackground()
		backgroundWork.Wait()
	}()
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
		service.RegisterAdmin(adminServer, service.NewAdmin(a.svc, a.slices))
		reflection.Register(adminServer)
		go func() { errc <- adminServer.Serve(lns.Admin) }()
		log.Info("admin API serving: keep this address private, Reset lifts limits", zap.String("addr", lns.Admin.Addr().String()))
	}
	if a.stats != nil {
		// Flushed every interval, and once more when Run ends.
		backgroundWork.Go(func() { a.stats.Run(background) })
	}
	if a.credentialsRefused.Load() {
		a.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
		backgroundWork.Go(func() {
			awaitCredentials(background, a.lim, log, func() {
				a.credentialsRefused.Store(false)
				a.setHealth(healthpb.HealthCheckResponse_SERVING) // a no-op once the health server is shut down
			})
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
	a.rlqs.Drain() // quota streams never end on their own
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
			// Past the drain deadline: what is left is cut, and the listener,
			// closed by Shutdown already, fails to close again.
			_ = srv.Close()
		}
	}
	log.Info("stopped")
	return serveErr
}
