package e2e

import (
	"errors"
	"net"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/service"
)

// startLibrary serves configYAML in the test's own process, through the
// public API (pkg/config, pkg/limiter, pkg/service) on r and a grpc-go
// server of the test's, as a Go program embedding the service would: for the
// tests where no process boundary (flags, environment, signals, exit codes,
// logs) is under test. The server has no logs, HTTP port or process.
func startLibrary(t *testing.T, r *redisServer, configYAML string, opts *service.Options) *server {
	t.Helper()
	cfg, err := config.Parse("config.yaml", []byte(configYAML), nil)
	if err != nil {
		t.Fatal(err)
	}
	// As the service's own client: no retry of a decision whose reply was
	// lost, which would charge it twice.
	client := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() }) // the test's outcome is decided
	// No test here is about the store's deadline: a busy machine may take
	// longer than the shipped second over a call.
	lim, err := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close) // after the server's stop, below: cleanups run last first
	svc := service.New(cfg, lim, opts)
	srv := grpc.NewServer(svc.ServerOptions()...)
	svc.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		svc.Drain()
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving: %v", err)
		}
	})
	s := &server{grpcAddr: ln.Addr().String()}
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s.conn, s.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	return s
}
