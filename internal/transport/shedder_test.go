package transport

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestShedderAdmitsUpToTheBound(t *testing.T) {
	shedder := NewShedder(2, nil)
	const rls = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// Two calls in flight, on two connections: their places are held until
	// done.
	var dones []func()
	for range 2 {
		done, err := shedder.NewConn().Admit(rls)
		if err != nil || done == nil {
			t.Fatalf("within the bound: %v", err)
		}
		dones = append(dones, done)
	}
	conn := shedder.NewConn()
	if _, err := conn.Admit(rls); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, method := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if done, err := conn.Admit(method); err != nil || done != nil {
			t.Fatalf("%s: shed (%v) or counted (%v)", method, err, done != nil)
		}
	}
	// A call's end gives its place back.
	dones[0]()
	if got := shedder.inFlight.Load(); got != 1 {
		t.Fatalf("%d in flight after one ended, want 1", got)
	}
	done, err := conn.Admit(rls)
	if err != nil {
		t.Fatalf("after a call ended: %v", err)
	}
	dones[1]()
	done()
	if got := shedder.inFlight.Load(); got != 0 {
		t.Fatalf("%d in flight after all ended, want 0", got)
	}
	if n := testing.AllocsPerRun(100, func() {
		done, _ := conn.Admit(rls)
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
	}), 1<<10)
	go slow.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/json", nil))
	<-entered
	// The gRPC side shares the bound.
	if _, err := shedder.NewConn().Admit("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC call while /json holds the only place: %v", err)
	}
	rec := httptest.NewRecorder()
	slow.ServeHTTP(rec, httptest.NewRequest("POST", "/json", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("second /json request: %d, want 503", rec.Code)
	}
	close(release)
}

// TestNoConnectionTakesEveryPlace: past half the places, a connection may
// hold no more than max/(n+1) of them, n being the connections holding
// any. Connections that came first may hold more until their calls end;
// then they get back no more than their share, and a newcomer finds room.
func TestNoConnectionTakesEveryPlace(t *testing.T) {
	const rls = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	shedder := NewShedder(512, nil)
	// take admits calls on conn until it is refused, and returns their dones.
	take := func(conn *Conn) []func() {
		var dones []func()
		for {
			done, err := conn.Admit(rls)
			if err != nil {
				return dones
			}
			dones = append(dones, done)
		}
	}
	first, second, third := shedder.NewConn(), shedder.NewConn(), shedder.NewConn()
	firsts := take(first)
	var held [][]func()
	for i, c := range []*Conn{second, third} {
		held = append(held, take(c))
		if want := []int{170, 86}[i]; len(held[i]) != want {
			t.Errorf("connection %d took %d places, want %d", i+2, len(held[i]), want)
		}
	}
	if len(firsts) != 256 {
		t.Errorf("the first connection took %d places alone, want half, 256", len(firsts))
	}
	// Every place is taken: a newcomer waits for calls to end.
	if _, err := shedder.NewConn().Admit(rls); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a newcomer with every place taken: %v", err)
	}
	for _, done := range firsts {
		done()
	}
	// The first connection's calls ended: it gets back only its share, with
	// three connections holding places: 512/(3+1).
	if firsts = take(first); len(firsts) != 128 {
		t.Errorf("the first connection took %d places back, want 128", len(firsts))
	}
	newcomer := take(shedder.NewConn())
	if len(newcomer) != 102 {
		t.Errorf("a newcomer took %d places, want its share of 512/5, 102", len(newcomer))
	}
	if done, err := shedder.NewConn().Admit(rls); err != nil {
		t.Errorf("a fifth connection with %d places free: %v", 512-shedder.inFlight.Load(), err)
	} else {
		done()
	}
	for _, dones := range append(held, firsts, newcomer) {
		for _, done := range dones {
			done()
		}
	}
	if shedder.inFlight.Load() != 0 || shedder.holders.Load() != 0 {
		t.Errorf("after every call ended: %d in flight, %d holders", shedder.inFlight.Load(), shedder.holders.Load())
	}
}

// TestJSONPlaceOnceTheBodyCame: a POST /json takes its place once its body
// has come whole, so a body that does not come holds none; one past the
// bound reaches the handler as its error, without a place.
func TestJSONPlaceOnceTheBodyCame(t *testing.T) {
	shedder := NewShedder(1, nil)
	var seen []string
	h := shedder.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		seen = append(seen, fmt.Sprintf("%q %v %d", body, err, shedder.inFlight.Load()))
	}), 8)
	stalled, stall := io.Pipe()
	defer stall.Close()
	done := make(chan struct{})
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/json", stalled))
		close(done)
	}()
	// The only place is free while that body does not come.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader("{}")))
	rec2 := httptest.NewRecorder()
	h.ServeHTTP(rec2, httptest.NewRequest("POST", "/json", strings.NewReader("0123456789")))
	if _, err := stall.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := stall.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	want := []string{`"{}" <nil> 1`, `"" http: request body too large 0`, `"late" <nil> 1`}
	if fmt.Sprint(seen) != fmt.Sprint(want) || rec.Code != 200 {
		t.Errorf("handler saw %q (status %d), want %q", seen, rec.Code, want)
	}
}
