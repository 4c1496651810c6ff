package service

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

func TestShedTapRefusesPastTheBound(t *testing.T) {
	shedder := NewShedder(2, nil)
	shed := shedder.TapHandle()
	rls := &tap.Info{FullMethodName: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	// Two streams in flight: their contexts live until they end.
	var ends []context.CancelFunc
	for i := 0; i < 2; i++ {
		ctx, end := context.WithCancel(context.Background())
		ends = append(ends, end)
		if _, err := shed(ctx, rls); err != nil {
			t.Fatalf("within the bound: %v", err)
		}
	}
	if _, err := shed(context.Background(), rls); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, method := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if _, err := shed(context.Background(), &tap.Info{FullMethodName: method}); err != nil {
			t.Fatalf("%s was shed: %v", method, err)
		}
	}
	// A stream's end, however it comes, gives its place back.
	ends[0]()
	waitInFlight(t, shedder, 1)
	ctx, end := context.WithCancel(context.Background())
	defer end()
	if _, err := shed(ctx, rls); err != nil {
		t.Fatalf("after a stream ended: %v", err)
	}
	ends[1]()
	end()
	waitInFlight(t, shedder, 0)
}

// waitInFlight waits for the places to be given back: context.AfterFunc
// runs in its own goroutine.
func waitInFlight(t *testing.T, s *Shedder, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.inFlight.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d in flight, want %d", s.inFlight.Load(), want)
		}
		time.Sleep(time.Millisecond)
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
	rls := &tap.Info{FullMethodName: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	if _, err := shedder.TapHandle()(context.Background(), rls); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC call while /json holds the only place: %v", err)
	}
	rec := httptest.NewRecorder()
	slow.ServeHTTP(rec, httptest.NewRequest("POST", "/json", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("second /json request: %d, want 503", rec.Code)
	}
	close(release)
}
