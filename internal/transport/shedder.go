package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// DefaultMaxInFlight bounds the requests a server works on at once, where
// options leave it zero. Past it a request is refused at once: queueing
// without bound would only answer after Envoy's timeout, with memory growing.
// 512 is far above what an instance holds at once while it keeps up (its
// rate times its latency: docs/bench.md has both), so only a server whose
// latency has grown past its capacity refuses; and 512 requests of the
// largest size (--max-request-bytes) fit in the central manifest's memory
// limit.
const DefaultMaxInFlight = 512

// Shedder bounds the rate limit requests worked on at once, over gRPC and
// POST /json together, so an overloaded server answers quickly and its
// memory stays bounded; Envoy then applies its own failure mode.
//
// A request takes a place only once it has come whole, so a client that
// sends slowly, or not at all, holds none. And no connection may take
// them all: once half the places are taken, a connection holding more than
// max/(n+1) of them, n being the connections holding any, is refused, which
// always leaves room for one more connection's requests.
type Shedder struct {
	max      int64
	inFlight atomic.Int64
	holders  atomic.Int64 // connections holding at least one place
	metrics  Observer
	prefix   string // the rate limit service's methods
}

// NewShedder returns a Shedder for maxInFlight requests (zero or less means
// DefaultMaxInFlight), counting refusals in m.
func NewShedder(maxInFlight int, m Observer) *Shedder {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	return &Shedder{max: int64(maxInFlight), metrics: observer(m), prefix: "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/"}
}

// Conn is one client connection's hold on a Shedder's places.
type Conn struct {
	s    *Shedder
	held atomic.Int64
	done func() // release, made once: Admit allocates nothing
}

// NewConn returns the hold of a new connection.
func (s *Shedder) NewConn() *Conn {
	c := &Conn{s: s}
	c.done = c.release
	return c
}

// acquire takes a place for c, or says why none is given.
func (c *Conn) acquire() error {
	s := c.s
	n := s.inFlight.Add(1)
	if n > s.max {
		s.inFlight.Add(-1)
		s.metrics.Shed()
		return fmt.Errorf("overloaded: more than %d requests in flight", s.max)
	}
	held := c.held.Add(1)
	holders := s.holders.Load()
	if held == 1 {
		holders = s.holders.Add(1)
	}
	if share := s.max / (max(holders, 1) + 1); n > s.max/2 && held > max(share, 1) {
		c.release()
		s.metrics.Shed()
		return fmt.Errorf("overloaded: this connection holds %d of the %d places, its share", held-1, s.max)
	}
	return nil
}

func (c *Conn) release() {
	if c.held.Add(-1) == 0 {
		c.s.holders.Add(-1)
	}
	c.s.inFlight.Add(-1)
}

// Admit (for grpcunary's Options.NewConnAdmit) takes a place for a rate
// limit call whose message has come whole, or refuses it with
// RESOURCE_EXHAUSTED. The place is given back by done, which the server
// calls when the call's handler returns. Other services, health checks
// among them, are never refused: a busy server is not a dead one.
func (c *Conn) Admit(fullMethod string) (done func(), err error) {
	if !strings.HasPrefix(fullMethod, c.s.prefix) {
		return nil, nil
	}
	if err := c.acquire(); err != nil {
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	return c.done, nil
}

type connKey struct{}

// ConnContext gives each connection its hold, as http.Server's ConnContext.
func (s *Shedder) ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, s.NewConn())
}

// conn is the hold ConnContext gave the connection of ctx, or a new one.
func (s *Shedder) conn(ctx context.Context) *Conn {
	if c, ok := ctx.Value(connKey{}).(*Conn); ok && c.s == s {
		return c
	}
	return s.NewConn()
}

// Handler refuses HTTP requests past the bound with 503. A request takes
// its place once its body (up to maxBody bytes) has come, as a gRPC call
// once its message has: a body sent slowly holds none. A body that fails
// to come whole is handed on as its error, for next to answer.
func (s *Shedder) Handler(next http.Handler, maxBody int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(maxBody)))
		if err != nil {
			r.Body = io.NopCloser(failedReader{err})
			next.ServeHTTP(w, r)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		c := s.conn(r.Context())
		if err := c.acquire(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer c.release()
		next.ServeHTTP(w, r)
	})
}

// failedReader fails every read with the error its body met.
type failedReader struct{ err error }

func (f failedReader) Read([]byte) (int, error) { return 0, f.err }

// StatsHandler and UnaryServerInterceptor bound grpc-go's server as
// grpcunary's is: the stats handler gives each connection its hold, and
// the interceptor (outermost) admits a call once grpc-go has read its
// message.
func (s *Shedder) StatsHandler() stats.Handler { return connTagger{s} }

// UnaryServerInterceptor admits grpc-go's calls; see StatsHandler.
func (s *Shedder) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		done, err := s.conn(ctx).Admit(info.FullMethod)
		if err != nil {
			return nil, err
		}
		if done != nil {
			defer done()
		}
		return handler(ctx, req)
	}
}

// connTagger is the stats handler that gives grpc-go's connections their
// holds; it observes nothing else.
type connTagger struct{ s *Shedder }

func (t connTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, t.s.NewConn())
}
func (connTagger) HandleConn(context.Context, stats.ConnStats)                     {}
func (connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connTagger) HandleRPC(context.Context, stats.RPCStats)                       {}
