package main

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Histogram counts latencies in log-linear buckets, as HDR histograms do:
// exact below 64 ns, then 32 buckets per power of two, so a reported
// quantile is within 1.6% of the true value. The zero value is ready.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
}

const (
	subBits     = 5 // 32 sub-buckets per power of two
	linear      = 2 << subBits
	histBuckets = linear + (64-subBits-1)*(1<<subBits)
)

func bucketOf(v time.Duration) int {
	u := uint64(max(v, 0))
	if u < linear {
		return int(u)
	}
	shift := bits.Len64(u) - subBits - 1 // u>>shift is in [32, 64)
	return linear + (shift-1)<<subBits + int(u>>shift) - 1<<subBits
}

// bucketValue is the middle of bucket i.
func bucketValue(i int) time.Duration {
	if i < linear {
		return time.Duration(i)
	}
	shift := (i-linear)>>subBits + 1
	m := uint64((i-linear)&(1<<subBits-1) + 1<<subBits)
	return time.Duration(m<<shift + (1<<shift)/2)
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.n++
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// Count is the number of latencies recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the latency below which a share q of the recorded ones
// fall (0 when none was recorded).
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return bucketValue(i)
		}
	}
	return bucketValue(histBuckets - 1)
}

// Load holds the gRPC connections of the service scenarios: few HTTP/2
// connections carrying many streams, as Envoy does.
type Load struct {
	conns []*grpc.ClientConn
	rls   []rlsv3.RateLimitServiceClient
}

// dial opens n connections to addr and waits until they are ready.
func dial(ctx context.Context, addr string, n int) (*Load, error) {
	l := &Load{}
	for range n {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			l.Close()
			return nil, err
		}
		l.conns = append(l.conns, conn)
		l.rls = append(l.rls, rlsv3.NewRateLimitServiceClient(conn))
		conn.Connect()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, conn := range l.conns {
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				l.Close()
				return nil, fmt.Errorf("connecting to %s: %v", addr, ctx.Err())
			}
		}
	}
	return l, nil
}

func (l *Load) Close() {
	for _, c := range l.conns {
		_ = c.Close() // the load is over: nothing is left to do about it
	}
}

// caller returns the call of worker w: ShouldRateLimit of a request drawn
// uniformly from reqs, on connection w mod the connections. The context
// carries the per-request deadline, which gRPC sends as grpc-timeout.
func (l *Load) caller(reqs []*rlsv3.RateLimitRequest) func(w int) Call {
	return func(w int) Call {
		client := l.rls[w%len(l.rls)]
		return func(ctx context.Context, rng *rand.Rand) (decisions, overLimit uint64, errCode string) {
			req := reqs[0]
			if len(reqs) > 1 {
				req = reqs[rng.IntN(len(reqs))]
			}
			return shouldRateLimit(ctx, client, req)
		}
	}
}

// shouldRateLimit sends req: the decisions it got and how many were
// denials, or the code of its error.
func shouldRateLimit(ctx context.Context, client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (
	decisions, overLimit uint64, errCode string) {
	resp, err := client.ShouldRateLimit(ctx, req)
	if err != nil {
		return 0, 0, status.Code(err).String()
	}
	for _, st := range resp.Statuses {
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			overLimit++
		}
	}
	return uint64(len(req.Descriptors)), overLimit, ""
}

// Call is one request of a worker: the decisions it got and how many of
// them were denials, or the code of its error ("DeadlineExceeded" for a
// missed deadline, as gRPC names codes.DeadlineExceeded).
type Call func(ctx context.Context, rng *rand.Rand) (decisions, overLimit uint64, errCode string)

// Class sorts a call by the key it asked for: its latency goes to the
// class's histogram beside the run's own (the Zipf keys' hot and cold
// ranks, skew.go).
type Class uint8

const (
	classNone Class = iota // the run's histogram only
	classHot               // one of the most frequent keys
	classCold              // a key drawn rarely
	classCount
)

// ClassedCall is a Call that also tells the class of the key it asked for.
type ClassedCall func(ctx context.Context, rng *rand.Rand) (decisions, overLimit uint64, errCode string, class Class)

// classless makes a Call a ClassedCall of classNone.
func classless(newCall func(w int) Call) func(w int) ClassedCall {
	return func(w int) ClassedCall {
		call := newCall(w)
		return func(ctx context.Context, rng *rand.Rand) (uint64, uint64, string, Class) {
			decisions, overLimit, errCode := call(ctx, rng)
			return decisions, overLimit, errCode, classNone
		}
	}
}

// deadlineExceeded is the error code of a missed deadline.
var deadlineExceeded = codes.DeadlineExceeded.String()

// phases of a run.
const (
	warming int32 = iota
	measuring
	stopped
)

// Run is one scenario's traffic: started by Start, measured between Measure
// and Stop.
type Run struct {
	phase   atomic.Int32
	wg      sync.WaitGroup
	workers []*worker
}

type worker struct {
	hist      Histogram
	byClass   [classCount]*Histogram // made at the class's first call; none for classNone
	requests  uint64
	decisions uint64
	overLimit uint64 // descriptors answered OVER_LIMIT
	late      uint64 // answers that came after the deadline (not enforced)
	errors    map[string]uint64
	seed      uint64
	_         [64]byte // keep workers' counters on their own cache lines
}

// Deadline is the per-request deadline of a run. Enforced, each call's
// context carries it (the service scenarios: gRPC sends it as grpc-timeout
// and the call fails with DEADLINE_EXCEEDED past it); not enforced, calls
// run without one and the answers later than it are counted as late (the
// floor client: Redis knows no deadline).
type Deadline struct {
	D       time.Duration
	Enforce bool
}

// Start launches concurrency workers, worker w sending newCall(w) back to
// back. With rate > 0 the workers are paced to send rate requests per second
// in all (each at most one in flight); a call's latency is then counted from
// when it was due, not when it could be sent, so that a stalled server is
// not hidden by the workers waiting for it (coordinated omission).
func Start(concurrency int, deadline Deadline, rate float64, newCall func(w int) Call) *Run {
	return StartClassed(concurrency, deadline, rate, classless(newCall))
}

// StartClassed is Start with calls that tell the class of their key: each
// call's latency is also recorded in its class's histogram.
func StartClassed(concurrency int, deadline Deadline, rate float64, newCall func(w int) ClassedCall) *Run {
	r := &Run{}
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(concurrency) / rate * float64(time.Second))
	}
	for i := range concurrency {
		w := &worker{errors: map[string]uint64{}, seed: uint64(i)}
		r.workers = append(r.workers, w)
		call := newCall(i)
		r.wg.Go(func() { r.work(w, call, deadline, interval) })
	}
	return r
}

func (r *Run) work(w *worker, call ClassedCall, deadline Deadline, interval time.Duration) {
	rng := rand.New(rand.NewPCG(w.seed, 0x5eed))
	var due time.Time
	if interval > 0 {
		due = time.Now().Add(rand.N(interval)) // spread the workers over one interval
	}
	for {
		var start time.Time
		if interval > 0 {
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
			start, due = due, due.Add(interval)
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if deadline.Enforce {
			ctx, cancel = context.WithTimeout(ctx, deadline.D)
		}
		if interval == 0 {
			start = time.Now()
		}
		decisions, overLimit, errCode, class := call(ctx, rng)
		elapsed := time.Since(start)
		cancel()
		switch r.phase.Load() {
		case warming:
			continue
		case stopped:
			return
		}
		w.hist.Record(elapsed)
		if class != classNone {
			if w.byClass[class] == nil {
				w.byClass[class] = new(Histogram)
			}
			w.byClass[class].Record(elapsed)
		}
		if errCode != "" {
			w.errors[errCode]++
			continue
		}
		if !deadline.Enforce && elapsed > deadline.D {
			w.late++
		}
		w.requests++
		w.decisions += decisions
		w.overLimit += overLimit
	}
}

// Measure starts recording.
func (r *Run) Measure() { r.phase.Store(measuring) }

// Stop ends recording and waits for the workers to finish their calls.
func (r *Run) Stop() Result {
	r.phase.Store(stopped)
	r.wg.Wait()
	var res Result
	res.Errors = map[string]uint64{}
	for _, w := range r.workers {
		res.Latency.Merge(&w.hist)
		if h := w.byClass[classHot]; h != nil {
			res.Hot.Merge(h)
		}
		if h := w.byClass[classCold]; h != nil {
			res.Cold.Merge(h)
		}
		res.Requests += w.requests
		res.Decisions += w.decisions
		res.OverLimit += w.overLimit
		res.Late += w.late
		for k, v := range w.errors {
			res.Errors[k] += v
		}
	}
	return res
}

// Result is what the client saw during the measured interval.
type Result struct {
	Latency   Histogram         // every call, failed ones included
	Hot, Cold Histogram         // the calls of class classHot, classCold (ClassedCall), failed ones included
	Requests  uint64            // successful calls
	Decisions uint64            // descriptors decided by successful calls
	OverLimit uint64            // descriptors answered OVER_LIMIT
	Late      uint64            // successful calls answered after the deadline, when it was not enforced
	Errors    map[string]uint64 // failed calls by error code, DeadlineExceeded included
}

// DeadlineMisses is the calls that missed the deadline: failed with
// DEADLINE_EXCEEDED, or answered late when the deadline was not enforced.
func (r *Result) DeadlineMisses() uint64 { return r.Errors[deadlineExceeded] + r.Late }

// OtherErrors is the failed calls whose error was not a missed deadline.
func (r *Result) OtherErrors() uint64 { return r.ErrorCount() - r.Errors[deadlineExceeded] }

func (r *Result) ErrorCount() uint64 {
	var n uint64
	for _, v := range r.Errors {
		n += v
	}
	return n
}

// ErrorSummary is the errors other than missed deadlines by code, e.g.
// "Unavailable 3, ResourceExhausted 1", or "0".
func (r *Result) ErrorSummary() string {
	var codes []string
	for k := range r.Errors {
		if k != deadlineExceeded {
			codes = append(codes, k)
		}
	}
	if len(codes) == 0 {
		return "0"
	}
	slices.Sort(codes)
	var parts []string
	for _, k := range codes {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Errors[k]))
	}
	return strings.Join(parts, ", ")
}
