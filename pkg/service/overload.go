package service

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/pkg/metrics"
)

// DefaultMaxInFlight bounds the requests a server works on at once, where
// options leave it zero. Past it a request is refused at once: queueing
// without bound would only answer after Envoy's timeout, with memory growing.
// At Envoy's 20 ms deadline, 512 in flight is about 25,000 requests a
// second, more than one instance decides; and 512 requests of the largest
// size (--max-request-bytes) fit in the central manifest's memory limit.
const DefaultMaxInFlight = 512

// Shedder bounds the rate limit requests worked on at once, over gRPC and
// POST /json together, so an overloaded server answers quickly and its
// memory stays bounded; Envoy then applies its own failure mode.
type Shedder struct {
	max      int64
	inFlight atomic.Int64
	metrics  *metrics.Metrics
	prefix   string // the rate limit service's methods
	done     func() // release, made once: Admit allocates nothing
}

// NewShedder returns a Shedder for maxInFlight requests (zero or less means
// DefaultMaxInFlight), counting refusals in m.
func NewShedder(maxInFlight int, m *metrics.Metrics) *Shedder {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	s := &Shedder{max: int64(maxInFlight), metrics: m, prefix: "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/"}
	s.done = s.release
	return s
}

// acquire takes a place, or reports that none is left.
func (s *Shedder) acquire() bool {
	if s.inFlight.Add(1) > s.max {
		s.inFlight.Add(-1)
		s.metrics.Shed()
		return false
	}
	return true
}

func (s *Shedder) release() { s.inFlight.Add(-1) }

// Admit (for grpcunary.Options.Admit) refuses a rate limit call past the
// bound with RESOURCE_EXHAUSTED as soon as its headers arrive, before its
// message is read: a refused call costs no message buffer. The place is
// given back by done, which the server calls when the call ends, however it
// ends. Other services, health checks among them, are never refused: a
// busy server is not a dead one.
func (s *Shedder) Admit(fullMethod string) (done func(), err error) {
	if !strings.HasPrefix(fullMethod, s.prefix) {
		return nil, nil
	}
	if !s.acquire() {
		return nil, status.Errorf(codes.ResourceExhausted, "overloaded: more than %d requests in flight", s.max)
	}
	return s.done, nil
}

// Handler refuses HTTP requests past the bound with 503.
func (s *Shedder) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.acquire() {
			http.Error(w, fmt.Sprintf("overloaded: more than %d requests in flight", s.max), http.StatusServiceUnavailable)
			return
		}
		defer s.release()
		next.ServeHTTP(w, r)
	})
}
