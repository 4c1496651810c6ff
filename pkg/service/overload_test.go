package service

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestShedderAdmitsUpToTheBound(t *testing.T) {
	shedder := NewShedder(2, nil)
	const rls = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// Two calls in flight: their places are held until done.
	var dones []func()
	for range 2 {
		done, err := shedder.Admit(rls)
		if err != nil || done == nil {
			t.Fatalf("within the bound: %v", err)
		}
		dones = append(dones, done)
	}
	if _, err := shedder.Admit(rls); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, method := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if done, err := shedder.Admit(method); err != nil || done != nil {
			t.Fatalf("%s: shed (%v) or counted (%v)", method, err, done != nil)
		}
	}
	// A call's end gives its place back.
	dones[0]()
	if got := shedder.inFlight.Load(); got != 1 {
		t.Fatalf("%d in flight after one ended, want 1", got)
	}
	done, err := shedder.Admit(rls)
	if err != nil {
		t.Fatalf("after a call ended: %v", err)
	}
	dones[1]()
	done()
	if got := shedder.inFlight.Load(); got != 0 {
		t.Fatalf("%d in flight after all ended, want 0", got)
	}
	if n := testing.AllocsPerRun(100, func() {
		done, _ := shedder.Admit(rls)
		done()
	}); n != 0 {
		t.Errorf("Admit allocates %v times per call, want 0", n)
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
	if _, err := shedder.Admit("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC call while /json holds the only place: %v", err)
	}
	rec := httptest.NewRecorder()
	slow.ServeHTTP(rec, httptest.NewRequest("POST", "/json", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("second /json request: %d, want 503", rec.Code)
	}
	close(release)
}
