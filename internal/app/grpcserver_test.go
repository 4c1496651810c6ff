package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/grpcunary"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// blockingRLS holds every ShouldRateLimit call until release is closed.
type blockingRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	started chan struct{}
	release chan struct{}
}

func (b *blockingRLS) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestGRPCServerKinds: each --grpc-server builds its kind of server, which
// serves what New registers, runs the interceptors, and sheds rate limit
// calls past --max-inflight while health checks still pass.
func TestGRPCServerKinds(t *testing.T) {
	for _, tc := range []struct {
		kind string
		want any
	}{
		{settings.GRPCServerLean, (*grpcunary.Server)(nil)},
		{settings.GRPCServerGRPCGo, (*grpc.Server)(nil)},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			s := &settings.Settings{GRPCServer: tc.kind, MaxRequestBytes: service.DefaultMaxRequestBytes, GRPCMaxConnAge: time.Hour}
			shedder := transport.NewShedder(1, metrics.New(prometheus.NewRegistry()))
			intercepted := make(chan string, 10)
			interceptor := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				intercepted <- info.FullMethod
				return handler(ctx, req)
			}
			srv, err := newGRPCServer(s, nil, encoding.GetCodecV2(grpcproto.Name), shedder, nil, []grpc.UnaryServerInterceptor{interceptor})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprintf("%T", srv), fmt.Sprintf("%T", tc.want); got != want {
				t.Fatalf("--grpc-server %s built a %s, want a %s", tc.kind, got, want)
			}
			rls := &blockingRLS{started: make(chan struct{}, 2), release: make(chan struct{})}
			rlsv3.RegisterRateLimitServiceServer(srv, rls)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			defer func() {
				srv.Stop()
				// Once stopped, grpc-go's Serve returns nil and grpcunary's ErrServerStopped.
				if err := <-served; err != nil && !errors.Is(err, grpcunary.ErrServerStopped) {
					t.Errorf("Serve: %v", err)
				}
			}()
			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			// One call takes the only place; the next is refused at once.
			first := make(chan error, 1)
			go func() {
				_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
				first <- err
			}()
			<-rls.started
			_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a call past --max-inflight: %v, want RESOURCE_EXHAUSTED", err)
			}
			if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("health check while the place is taken: %v", err)
			}
			close(rls.release)
			if err := <-first; err != nil {
				t.Fatalf("the call holding the place: %v", err)
			}
			// The refused call never reached the interceptors: the shedder
			// is outermost.
			close(intercepted)
			var seen []string
			for m := range intercepted {
				seen = append(seen, m)
			}
			want := []string{"/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit", "/grpc.health.v1.Health/Check"}
			if !slices.Equal(seen, want) {
				t.Fatalf("the interceptor saw %q, want %q", seen, want)
			}
			if _, ok := srv.GetServiceInfo()[healthpb.Health_ServiceDesc.ServiceName]; !ok {
				t.Fatalf("services %v: health is not among them", srv.GetServiceInfo())
			}
		})
	}
}
