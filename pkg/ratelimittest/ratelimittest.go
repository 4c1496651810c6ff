// Package ratelimittest starts a rate limit service in process, for a Go
// program's own tests: the service's config parser, limiter and gRPC
// services on the embedded store (an in-process Redis), listening on a
// loopback port, from a YAML string. Point the code under test (a client of
// ShouldRateLimit, an Envoy emulation, a gRPC interceptor) at Addr.
//
// Everything it starts stops when the test ends.
package ratelimittest

import (
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/service"
)

// Server is a rate limit service running in the test's process.
type Server struct {
	// Addr is the gRPC address, host:port on loopback.
	Addr string
	// Service is the service the gRPC server serves; its ShouldRateLimit
	// may also be called directly.
	Service *service.Service
	// Limiter is the limiter the service decides on, to reach the same
	// counters from Go.
	Limiter *limiter.Limiter
}

// Start serves the config yaml (envoyproxy/ratelimit's format with this
// project's extensions) on the embedded store until the test ends. opts may be
// nil. A config that does not load fails the test, with the error's line.
func Start(tb testing.TB, yaml string, opts *service.Options) *Server {
	tb.Helper()
	cfg, err := config.Parse("ratelimittest.yaml", []byte(yaml), nil)
	if err != nil {
		tb.Fatalf("ratelimittest: %v", err)
	}
	lim, err := limiter.NewEmbedded(nil)
	if err != nil {
		tb.Fatalf("ratelimittest: %v", err)
	}
	svc := service.New(cfg, lim, opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lim.Close()
		tb.Fatalf("ratelimittest: %v", err)
	}
	srv := grpc.NewServer(svc.ServerOptions()...)
	svc.Register(srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln) // ends with Stop below
	}()
	tb.Cleanup(func() {
		svc.Drain()
		srv.Stop()
		<-served
		lim.Close()
	})
	return &Server{Addr: ln.Addr().String(), Service: svc, Limiter: lim}
}

// Client returns a ShouldRateLimit client connected to s, closed when the
// test ends.
func (s *Server) Client(tb testing.TB) rlsv3.RateLimitServiceClient {
	tb.Helper()
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("ratelimittest: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}
