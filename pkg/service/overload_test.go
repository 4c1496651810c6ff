package service

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestShedInterceptorRefusesPastTheBound(t *testing.T) {
	shedder := NewShedder(2, nil)
	shed := shedder.UnaryInterceptor()
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

func TestShedderBoundsJSONToo(t *testing.T) {
	shedder := NewShedder(1, nil)
	release := make(chan struct{})
	entered := make(chan struct{})
	slow := shedder.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
	}))
	go slow.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/json", nil))
	<-entered
	// The gRPC side shares the bound.
	rls := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	if _, err := shedder.UnaryInterceptor()(context.Background(), nil, rls, func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC call while /json holds the only place: %v", err)
	}
	rec := httptest.NewRecorder()
	slow.ServeHTTP(rec, httptest.NewRequest("POST", "/json", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("second /json request: %d, want 503", rec.Code)
	}
	close(release)
}
