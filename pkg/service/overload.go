package service

import (
	"context"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/pkg/metrics"
)

// DefaultMaxInFlight bounds the requests a server works on at once, where
// options leave it zero. Past it a request is refused at once: queueing
// without bound would only answer after Envoy's timeout, with memory growing.
const DefaultMaxInFlight = 4096

// ShedInterceptor refuses unary calls beyond maxInFlight at once with
// RESOURCE_EXHAUSTED, so an overloaded server answers quickly and memory
// stays bounded; Envoy then applies its own failure mode. Health checks are
// never refused: a busy server is not a dead one.
func ShedInterceptor(maxInFlight int, m *metrics.Metrics) grpc.UnaryServerInterceptor {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	var inFlight atomic.Int64
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
			return handler(ctx, req)
		}
		defer inFlight.Add(-1)
		if n := inFlight.Add(1); n > int64(maxInFlight) {
			m.Shed()
			return nil, status.Errorf(codes.ResourceExhausted, "overloaded: more than %d requests in flight", maxInFlight)
		}
		return handler(ctx, req)
	}
}
