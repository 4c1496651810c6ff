// Package limiter decides rate limits on Redis. It takes hits (a key, an
// algorithm, a limit, a window, a cost) and answers, per hit, whether it
// fits, what is left and when the limit frees up: each request atomically,
// by the Lua of scripts/lua with Redis TIME as the clock, batched per hash
// slot (batcher.go). It knows nothing of gRPC. The registries other layers
// keep beside the counters (internal/fairshare, internal/regions) reach the
// store through it (Numbers, registry.go). docs/development.md, "Inside the
// limiter", says how all or nothing, the roads back and the clocks work.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// DefaultTimeout bounds a request's store work when Options do not say. It
// is an upper bound: the caller's own deadline (Envoy's rate limit filter
// sends 20 ms by default) is what normally ends the wait.
const DefaultTimeout = time.Second

// Options configure a Limiter. A nil *Options means the defaults.
type Options struct {
	// Timeout bounds a request's store work, queueing included, when the
	// caller's deadline is later or absent; zero means DefaultTimeout.
	Timeout time.Duration
	// Observe, when set, is called after every store call with its
	// duration and error (nil on success); see ErrorKind. A request whose
	// deadline passed before it was sent is not a store call: Decide
	// reports it with ErrOverloaded.
	Observe func(d time.Duration, err error)
	// Overloaded, when set, is called for every request whose deadline
	// passed before its store call was sent (Decide returns ErrOverloaded).
	Overloaded func()
	// DenyCache is how long at most a denial Redis gave may be repeated
	// from memory for the same counter (see denyCache); zero means
	// DefaultDenyCache, a negative value turns the cache off. It reads Now,
	// not Redis's clock: tests that move Redis's clock by hand turn it off,
	// or move Now with it.
	DenyCache time.Duration
	// Now is the clock of the deny cache and of the calendar windows' edges
	// sent to the store (Hit.Calendar); nil means time.Now. Deadlines and
	// the durations Observe gets are on the real clock whatever it says.
	// The app gives the service's Options.Now (the reference's keys'
	// clock) here too.
	Now func() time.Time
	// TracerProvider gives the tracer of the spans of Redis batches (see
	// batcher); nil means OpenTelemetry's global provider, a no-op unless
	// one was installed.
	TracerProvider trace.TracerProvider
}

// tracerName names the limiter's tracer (instrumentation scope).
const tracerName = "github.com/slidingwindow/ratelimit/internal/limiter"

// DefaultDenyCache bounds how long a denial is repeated from memory.
const DefaultDenyCache = time.Second

// Limiter decides hits against a Redis store. It is safe for concurrent use.
type Limiter struct {
	router     router
	timeout    time.Duration
	observe    func(time.Duration, error)
	overloaded func()
	denied     *denyCache // nil: off
	now        func() time.Time
	tracer     trace.Tracer

	batchers sync.Map       // redis.UniversalClient to its *batcher
	refunds  sync.WaitGroup // refunds still running after their answers

	// life is held for reading by Decide and Reset, for writing by Close,
	// which thus waits for the calls in flight and refuses later ones.
	life   sync.RWMutex
	closed bool
	stop   chan struct{} // ends the sweep of a cluster's batchers
	swept  sync.WaitGroup
}

// decideScript is shared by every Limiter: a *redis.Script only holds the
// source and its hash.
var decideScript = redis.NewScript(lua.Decide())

// New returns a Limiter on store: go-redis's *Client (standalone or a
// Sentinel failover client) or *ClusterClient, or a UniversalClient holding
// one of them. On a cluster, the hits of a request are grouped by hash slot
// and each group runs on its slot's master, all groups at once.
//
// Concurrent requests' scripts share pipelines to each server (see batcher);
// Close stops them.
func New(store redis.UniversalClient, opts *Options) *Limiter {
	var r router = singleRouter{store}
	if cc, ok := store.(*redis.ClusterClient); ok {
		r = newClusterRouter(cc)
	}
	return newWithRouter(r, opts)
}

func newWithRouter(r router, opts *Options) *Limiter {
	l := &Limiter{router: r, timeout: DefaultTimeout, observe: func(time.Duration, error) {}, overloaded: func() {},
		now: time.Now, stop: make(chan struct{})}
	if opts != nil && opts.Now != nil {
		l.now = opts.Now
	}
	if opts != nil && opts.Timeout > 0 {
		l.timeout = opts.Timeout
	}
	if opts != nil && opts.Observe != nil {
		l.observe = opts.Observe
	}
	if opts != nil && opts.Overloaded != nil {
		l.overloaded = opts.Overloaded
	}
	tp := otel.GetTracerProvider()
	if opts != nil && opts.TracerProvider != nil {
		tp = opts.TracerProvider
	}
	l.tracer = tp.Tracer(tracerName)
	switch {
	case opts == nil || opts.DenyCache == 0:
		l.denied = newDenyCache(DefaultDenyCache, l.now())
	case opts.DenyCache > 0:
		l.denied = newDenyCache(opts.DenyCache, l.now())
	}
	if _, ok := r.(*clusterRouter); ok {
		l.swept.Go(l.sweepEvery)
	}
	return l
}

// sweepInterval is how often the batchers of servers that left a cluster
// are stopped. go-redis forgets a node a minute after it left the slot map.
const sweepInterval = time.Minute

func (l *Limiter) sweepEvery() {
	ticker := time.NewTicker(sweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-ticker.C:
			l.sweep(context.Background())
		}
	}
}

// sweep stops the batchers of servers that are no longer masters: after
// failovers and reshardings, nothing would ever call them again.
func (l *Limiter) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*l.timeout)
	defer cancel()
	live, err := l.router.live(ctx)
	if err != nil {
		return // keep every batcher: better idle than gone
	}
	l.batchers.Range(func(server, b any) bool {
		if !slices.Contains(live, server.(redis.UniversalClient)) && l.batchers.CompareAndDelete(server, b) {
			b.(*batcher).close()
		}
		return true
	})
}

// Prepare makes every server in use ready for decisions: the decide code
// loaded and a connection open per batcher worker, so that the first
// requests pay no setup. A server may still lose them later (a restart, a
// failover): calls load the code again as needed.
func (l *Limiter) Prepare(ctx context.Context) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return ErrClosed
	}
	servers, err := l.router.live(ctx)
	if err != nil {
		return fmt.Errorf("%w: prepare: %w", ErrStore, err)
	}
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, server := range servers {
		wg.Go(func() { errs[i] = l.batcher(server).prepare(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: prepare: %w", ErrStore, err)
	}
	return nil
}

// script runs s (or function: see call.function) on the server of keys
// (which share a slot), in that server's next pipeline.
func (l *Limiter) script(ctx context.Context, function string, s *redis.Script, keys []string, args []any) *redis.Cmd {
	server, err := l.router.server(ctx, keys[0])
	if err != nil {
		return errCmd(ctx, err)
	}
	cmd := l.batcher(server).do(ctx, function, s, keys, args)
	// A caller that gave up says nothing of the cluster's layout.
	if cmd.Err() != nil && ctx.Err() == nil {
		l.router.failed(cmd.Err())
	}
	return cmd
}

// timed is script within the limiter's timeout, observed like every store
// call.
func (l *Limiter) timed(ctx context.Context, function string, s *redis.Script, keys []string, args []any) *redis.Cmd {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	cmd := l.script(ctx, function, s, keys, args)
	l.observe(time.Since(start), cmd.Err())
	return cmd
}

// batcher returns the batcher of server, starting it on first use. A
// cluster's servers are its slot masters: the map grows with the masters
// seen, which a failover adds to.
func (l *Limiter) batcher(server redis.UniversalClient) *batcher {
	if b, ok := l.batchers.Load(server); ok {
		return b.(*batcher)
	}
	b := newBatcher(server, l.timeout, l.router.node, l.tracer)
	if prev, loaded := l.batchers.LoadOrStore(server, b); loaded {
		b.close() // another call started one first
		return prev.(*batcher)
	}
	return b
}

// ErrClosed answers the calls made after Close, by failure mode.
var ErrClosed = fmt.Errorf("%w: limiter closed", ErrStore)

// Close waits for the calls in flight and the refunds under way, then stops
// the limiter's batchers. Later calls are answered by failure mode.
func (l *Limiter) Close() {
	l.life.Lock()
	if l.closed {
		l.life.Unlock()
		return
	}
	l.closed = true
	l.life.Unlock()
	close(l.stop)
	l.swept.Wait()
	l.refunds.Wait()
	l.batchers.Range(func(server, b any) bool {
		b.(*batcher).close()
		l.batchers.Delete(server)
		return true
	})
	l.router.close()
}
