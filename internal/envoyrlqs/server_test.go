package envoyrlqs

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// fakeRLQS is a RateLimitQuotaService that records every stream's reports
// and sends what the test pushes.
type fakeRLQS struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	mu      sync.Mutex
	streams []*fakeStream
}

type fakeStream struct {
	reports []*rlqspb.RateLimitQuotaUsageReports // under fakeRLQS.mu
	out     chan *rlqspb.RateLimitQuotaResponse
	end     chan error
}

func (s *fakeRLQS) StreamRateLimitQuotas(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	fs := &fakeStream{out: make(chan *rlqspb.RateLimitQuotaResponse, 16), end: make(chan error, 1)}
	s.mu.Lock()
	s.streams = append(s.streams, fs)
	s.mu.Unlock()
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			s.mu.Lock()
			fs.reports = append(fs.reports, r)
			s.mu.Unlock()
		}
	}()
	for {
		select {
		case r := <-fs.out:
			if err := stream.Send(r); err != nil {
				return err
			}
		case err := <-fs.end:
			return err
		case <-stream.Context().Done():
			return nil
		}
	}
}

// reports returns the reports of every stream, in order of arrival per
// stream and of the streams' opening.
func (s *fakeRLQS) reports() [][]*rlqspb.RateLimitQuotaUsageReports {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]*rlqspb.RateLimitQuotaUsageReports, len(s.streams))
	for i, fs := range s.streams {
		out[i] = append([]*rlqspb.RateLimitQuotaUsageReports(nil), fs.reports...)
	}
	return out
}

// all returns every report of every stream.
func (s *fakeRLQS) all() []*rlqspb.RateLimitQuotaUsageReports {
	var out []*rlqspb.RateLimitQuotaUsageReports
	for _, rs := range s.reports() {
		out = append(out, rs...)
	}
	return out
}

func (s *fakeRLQS) latest(t testing.TB) *fakeStream {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) == 0 {
		t.Fatal("no stream open")
	}
	return s.streams[len(s.streams)-1]
}

// push sends actions on the latest stream.
func (s *fakeRLQS) push(t testing.TB, actions ...*rlqspb.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	s.latest(t).out <- &rlqspb.RateLimitQuotaResponse{BucketAction: actions}
}

// env is a fake server on a loopback port, a connection to it and a frozen
// clock for the clients' token buckets.
type env struct {
	t     testing.TB
	srv   *fakeRLQS
	gs    *grpc.Server
	addr  string
	conn  *grpc.ClientConn
	clock *fakeClock
}

func newEnv(t testing.TB) *env {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, addr: lis.Addr().String(), clock: &fakeClock{base: time.Unix(1_000_000, 0)}}
	e.serve(lis)
	// Short reconnect backoff: the tests restart the server.
	e.conn, err = grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.conn.Close()
		e.gs.Stop()
	})
	return e
}

func (e *env) serve(lis net.Listener) {
	e.srv = &fakeRLQS{}
	e.gs = grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(e.gs, e.srv)
	go func() { _ = e.gs.Serve(lis) }()
}

// stop kills the server; restart brings a new one up on the same address.
func (e *env) stop() { e.gs.Stop() }

func (e *env) restart() {
	e.t.Helper()
	lis, err := net.Listen("tcp", e.addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.serve(lis)
}

// client starts a client on the env's clock, closed at the test's end.
func (e *env) client(opts Options) *Client {
	if opts.Domain == "" {
		opts.Domain = "d"
	}
	if opts.Now == nil {
		opts.Now = e.clock.Now
	}
	c, err := New(e.conn, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c
}

type fakeClock struct {
	base time.Time
	ns   atomic.Int64
}

func (f *fakeClock) Now() time.Time          { return f.base.Add(time.Duration(f.ns.Load())) }
func (f *fakeClock) Advance(d time.Duration) { f.ns.Add(int64(d)) }

// wait fails t unless cond holds within a generous bound.
func wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !waitfor.True(10*time.Second, 5*time.Millisecond, cond) {
		t.Fatalf("%s: not so after 10s", what)
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

var (
	allowAll = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	denyAll  = blanket(typev3.RateLimitStrategy_DENY_ALL)
)

func tokenBucketProto(maxTokens, perFill uint32, fill *durationpb.Duration) *typev3.TokenBucket {
	return &typev3.TokenBucket{MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: fill}
}

func tokenBucketStrategy(maxTokens, perFill uint32, fill *durationpb.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tokenBucketProto(maxTokens, perFill, fill)}}
}

func assign(id map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s,
			},
		},
	}
}

func abandon(id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}

var hour = durationpb.New(time.Hour)

// endStream ends the latest stream with an error, as a server going away.
func (s *fakeRLQS) endStream(t *testing.T) {
	t.Helper()
	s.latest(t).end <- status.Error(codes.Unavailable, "going away")
}
