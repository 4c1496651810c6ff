package service

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestShedInterceptorRefusesPastTheBound(t *testing.T) {
	shed := ShedInterceptor(2, nil)
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(2)
	block := func(context.Context, any) (any, error) {
		entered.Done()
		<-release
		return "done", nil
	}
	rls := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Go(func() {
			if _, err := shed(context.Background(), nil, rls, block); err != nil {
				t.Errorf("within the bound: %v", err)
			}
		})
	}
	entered.Wait()

	_, err := shed(context.Background(), nil, rls, block)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	health := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	if _, err := shed(context.Background(), nil, health, func(context.Context, any) (any, error) { return "ok", nil }); err != nil {
		t.Fatalf("a health check was shed: %v", err)
	}
	close(release)
	wg.Wait()
	if _, err := shed(context.Background(), nil, rls, func(context.Context, any) (any, error) { return "ok", nil }); err != nil {
		t.Fatalf("after the load passed: %v", err)
	}
}
