package h2attack

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Legit is the clients an attack must not hurt: grpc-go clients, as
// Envoy's are, making rate limit calls with a deadline. Its connection is
// dialed, and a call answered, by DialLegit, so that it is one the
// service accepted before the attack; Run dials another during the
// attack.
type Legit struct {
	addr string
	cc   *grpc.ClientConn
	rls  rlsv3.RateLimitServiceClient
}

// DialLegit connects to addr and makes one call, which must be answered
// before ctx ends.
func DialLegit(ctx context.Context, addr string, call Call) (*Legit, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	l := &Legit{addr: addr, cc: cc, rls: rlsv3.NewRateLimitServiceClient(cc)}
	if _, err := l.rls.ShouldRateLimit(ctx, call.request(), grpc.WaitForReady(true)); err != nil {
		_ = cc.Close() // the call's error is the one to report
		return nil, fmt.Errorf("the first call to %s: %w", addr, err)
	}
	return l, nil
}

// Close closes the connection.
func (l *Legit) Close() error {
	return l.cc.Close()
}

// LegitOptions shape Run.
type LegitOptions struct {
	Call Call
	// Callers call at once on the connection DialLegit made (default 8).
	Callers int
	// Deadline is each call's (default 5 s): what a call may take before
	// it counts as failed, not a latency goal.
	Deadline time.Duration
	// NewConnAfter is when the new connection is dialed, from Run's start
	// (default: a quarter of the way to ctx's deadline, or at once without
	// one). One caller calls on it from then on, at least once.
	NewConnAfter time.Duration
}

// LegitResult counts the legitimate calls' outcomes.
type LegitResult struct {
	// Calls is the calls made, OK and OverLimit those answered so.
	Calls, OK, OverLimit int64
	// Errors counts the failed calls by gRPC code.
	Errors map[codes.Code]int64
	// NewConnCalls is the calls made on the connection dialed during the
	// run, NewConnAnswered those answered; NewConnErr is the first of its
	// errors.
	NewConnCalls, NewConnAnswered int64
	NewConnErr                    error
	// FirstErr is the first failed call's error.
	FirstErr error
	// MeanLatency and MaxLatency are the calls' time to an answer or an
	// error: reported, for a reader to judge, not a bound.
	MeanLatency, MaxLatency time.Duration
}

// Answered is the calls answered OK or OVER_LIMIT.
func (r LegitResult) Answered() int64 {
	return r.OK + r.OverLimit
}

// AnsweredShare is Answered over Calls, in [0, 1]; 0 when no call was
// made.
func (r LegitResult) AnsweredShare() float64 {
	if r.Calls == 0 {
		return 0
	}
	return float64(r.Answered()) / float64(r.Calls)
}

// DialedBeforeShare is AnsweredShare of the calls on the connections
// dialed before the run, the new connection's left out; 0 when none was
// made.
func (r LegitResult) DialedBeforeShare() float64 {
	calls := r.Calls - r.NewConnCalls
	if calls <= 0 {
		return 0
	}
	return float64(r.Answered()-r.NewConnAnswered) / float64(calls)
}

func (r LegitResult) String() string {
	s := fmt.Sprintf("%d calls: %d OK, %d OVER_LIMIT (%.2f%% answered)", r.Calls, r.OK, r.OverLimit, 100*r.AnsweredShare())
	for _, code := range slices.Sorted(maps.Keys(r.Errors)) {
		s += fmt.Sprintf(", %d %v", r.Errors[code], code)
	}
	s += fmt.Sprintf("; latency mean %v, max %v", r.MeanLatency.Round(time.Millisecond), r.MaxLatency.Round(time.Millisecond))
	s += fmt.Sprintf("; new connection: %d of %d answered", r.NewConnAnswered, r.NewConnCalls)
	if r.NewConnErr != nil {
		s += fmt.Sprintf(" (first error: %v)", r.NewConnErr)
	}
	if r.FirstErr != nil {
		s += fmt.Sprintf("; first error: %v", r.FirstErr)
	}
	return s
}

// Run calls until ctx ends, and counts. Calls in flight then finish, by
// their deadline at the latest: a call is never cut short by the end of
// the run, which would count a server's slowness as the run's doing.
func (l *Legit) Run(ctx context.Context, o LegitOptions) LegitResult {
	o.Callers = orDefault(o.Callers, 8)
	o.Deadline = orDefault(o.Deadline, 5*time.Second)
	if o.NewConnAfter <= 0 {
		if deadline, ok := ctx.Deadline(); ok {
			o.NewConnAfter = time.Until(deadline) / 4
		}
	}
	req := o.Call.request()

	var (
		calls, ok, over, newCalls, newAnswered atomic.Int64
		mu                                     sync.Mutex
		errs                                   = map[codes.Code]int64{}
		firstErr, newErr                       error
		total, slowest                         time.Duration
	)
	// call makes one call on rls and counts it; it reports whether it was
	// answered.
	call := func(rls rlsv3.RateLimitServiceClient, onNew bool) bool {
		began := time.Now()
		callCtx, cancel := context.WithTimeout(context.Background(), o.Deadline)
		resp, err := rls.ShouldRateLimit(callCtx, req)
		cancel()
		took := time.Since(began)
		mu.Lock()
		total += took
		slowest = max(slowest, took)
		mu.Unlock()
		calls.Add(1)
		if onNew {
			newCalls.Add(1)
		}
		if err != nil {
			mu.Lock()
			errs[status.Code(err)]++
			if firstErr == nil {
				firstErr = err
			}
			if onNew && newErr == nil {
				newErr = err
			}
			mu.Unlock()
			return false
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			over.Add(1)
		} else {
			ok.Add(1)
		}
		if onNew {
			newAnswered.Add(1)
		}
		return true
	}

	var wg sync.WaitGroup
	for range o.Callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				call(l.rls, false)
			}
		})
	}
	wg.Go(func() {
		pause(ctx, o.NewConnAfter)
		if ctx.Err() != nil {
			return
		}
		cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			mu.Lock()
			newErr = fmt.Errorf("dialing %s: %w", l.addr, err)
			mu.Unlock()
			return
		}
		defer cc.Close()
		// At least one call on a connection dialed during the run, however
		// late a busy machine ran this: otherwise nothing says it was served.
		rls := rlsv3.NewRateLimitServiceClient(cc)
		for call(rls, true); ctx.Err() == nil; {
			call(rls, true)
		}
	})
	wg.Wait()

	res := LegitResult{
		Calls: calls.Load(), OK: ok.Load(), OverLimit: over.Load(), Errors: errs,
		NewConnCalls: newCalls.Load(), NewConnAnswered: newAnswered.Load(), NewConnErr: newErr,
		FirstErr: firstErr, MaxLatency: slowest,
	}
	if res.Calls > 0 {
		res.MeanLatency = total / time.Duration(res.Calls)
	}
	return res
}
