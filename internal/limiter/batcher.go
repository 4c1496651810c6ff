package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// batcher sends the store calls of concurrent requests to one server
// together: the decide requests of one hash slot waiting at the same
// moment become one call of the decide code, which decides them in queue
// order, and the batch's calls go in one pipeline (batchsend.go; this file
// gathers). It batches as auto-pipelining Redis clients do: a worker takes
// the first waiting call and whatever else is queued (up to maxBatchHits
// hits), one worker collecting at a time. With no batch in flight the
// batch goes at once; with one in flight, the worker gathers until it
// lands (Redis runs one call at a time: a batch sent then would only wait
// there). No batch waits on a timer, nor past a call's deadline. A call
// whose caller left or whose deadline passed is not sent, but in its late
// form (call.lateArgs); a caller that left after its call was taken can
// still undo what it did (call.orphan). The batcher reads no command's
// meaning.
//
// A call Redis ran is never sent again (a decide run twice would charge
// twice); those Redis refused without running them are re-sent: NOSCRIPT,
// a function library not loaded yet, MOVED and ASK. A batch runs on a
// context of its own (a caller that leaves must not cancel the others'
// calls), so its span (batchSpanName) is a root, linked to the span of
// every request it carries.
type batcher struct {
	server  redis.UniversalClient
	calls   chan *call
	timeout time.Duration
	tracer  trace.Tracer
	// node returns the client of a node a redirection names.
	node func(ctx context.Context, addr string, moved bool) (redis.UniversalClient, error)
	// scriptsOnly is set once the server turned out not to have Redis
	// Functions (before Redis 7, the embedded store).
	scriptsOnly atomic.Bool
	stop        chan struct{}
	workers     sync.WaitGroup
	// collect is held by the worker taking calls from the queue; inflight
	// counts the batches sent and not answered; landed is told when one is
	// (a token at most, drained before a look at inflight).
	collect  sync.Mutex
	inflight atomic.Int32
	landed   chan struct{}
}

// call is one store call waiting for its batch.
type call struct {
	// ctx is the caller's; a call whose caller left is not sent (but in its
	// late form).
	ctx context.Context
	// deadline is when the answer stops being of use, at most the caller's:
	// a call not sent by then is not sent (but in its late form).
	deadline time.Time
	slot     int
	// script is the script to run, nil for a decide request (which shares
	// its slot's decide call); function, if set, the library's function of
	// the same code, called where the server has functions.
	script   *redis.Script
	function string
	keys     []string
	// records are keys a decide request touches besides its hits' (slices'
	// records), declared after every hit's key of the call, so that Redis
	// Cluster refuses the call during a migration that split them.
	records []string
	args    []any
	queued  time.Time    // when it was queued
	sent    atomic.Bool  // the call went into a pipeline
	done    chan outcome // buffered: a worker never waits for the caller
	// orphan, when set, is handed done when the caller stops waiting for
	// a call taken from the queue, so that what Redis did for no one to
	// hear (a seat taken: Limiter.orphanedLeases) can be undone. The
	// outcome says ErrOverloaded when the call was not sent after all.
	orphan func(done <-chan outcome)
	// lateArgs, when set, is the call's late form, sent in place of args
	// once its caller left or its deadline passed: a command owed to the
	// store whatever its caller does (the limiter's lateForm). Such a call
	// waits for room, and its batch runs, up to the store timeout.
	lateArgs []any
	// sentLate marks a call sent in its late form: its reply is for no
	// caller, who is answered ErrOverloaded (the worker's field alone).
	sentLate bool
}

// outcome is what a call gets back.
type outcome struct {
	cmd  *redis.Cmd // a script call's reply
	vals []int64    // a decide request's part of the reply: 4 per hit
	err  error
}

const (
	batchWorkers = 2
	// maxBatchHits bounds the hits a worker takes at once, which bounds
	// how long Redis is kept busy by one decide call.
	maxBatchHits = 512
	queueLength  = 1024
)

// ErrOverloaded reports a call whose deadline passed while it waited in the
// service, before it was sent: the service, not the store, was too slow.
// (A call with a late form still goes, in that form: see call.lateArgs.)
var ErrOverloaded = errors.New("rate limit store queue: the deadline passed before the call was sent")

// newBatcher starts the batcher of server. tracer starts the span of each
// batch; nil means no spans.
func newBatcher(server redis.UniversalClient, timeout time.Duration,
	node func(context.Context, string, bool) (redis.UniversalClient, error), tracer trace.Tracer) *batcher {
	if tracer == nil {
		tracer = noop.NewTracerProvider().Tracer("")
	}
	b := &batcher{
		server:  server,
		calls:   make(chan *call, queueLength),
		timeout: timeout,
		tracer:  tracer,
		node:    node,
		stop:    make(chan struct{}),
		landed:  make(chan struct{}, 1),
	}
	for range batchWorkers {
		b.workers.Go(b.work)
	}
	return b
}

// decide queues c, a decide request (its script nil), and returns its four
// values per hit.
func (b *batcher) decide(c *call) ([]int64, error) {
	o := b.enqueue(c)
	return o.vals, o.err
}

// do runs script (or function: see call.function) on its own (not merged
// with others) in the next batch, by ctx's deadline and at most the store
// timeout from now.
func (b *batcher) do(ctx context.Context, function string, script *redis.Script, keys []string, args []any) *redis.Cmd {
	deadline := time.Now().Add(b.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	o := b.enqueue(&call{ctx: ctx, deadline: deadline, script: script, function: function, keys: keys, args: args})
	if o.err != nil {
		return errCmd(ctx, o.err)
	}
	return o.cmd
}

// enqueue queues c and waits for its outcome, its deadline or its caller's
// leaving. A timer ends the wait at the deadline, before the caller's
// context ends (maxAnswerMargin): a call still queued, or in a batch that
// waits for later deadlines, is answered in time.
func (b *batcher) enqueue(c *call) outcome {
	c.done = make(chan outcome, 1)
	c.queued = time.Now()
	expiry := time.NewTimer(time.Until(c.deadline))
	defer expiry.Stop()
	if err := b.queue(c, expiry.C); err != nil {
		return outcome{err: err}
	}
	select {
	case o := <-c.done:
		return c.answered(o)
	case <-c.ctx.Done():
		return c.late(c.ctx.Err())
	case <-expiry.C:
		return c.late(context.DeadlineExceeded)
	case <-b.stop:
		// The workers finish the batches they took: a call sent still
		// gets its outcome.
		return c.late(errBatcherStopped)
	}
}

// queue puts c in the queue, unless its caller leaves or expired fires
// first. A call with a late form waits for room up to the store timeout
// whatever its caller does (see call.lateArgs).
func (b *batcher) queue(c *call, expired <-chan time.Time) error {
	left := c.ctx.Done()
	if c.lateArgs != nil {
		t := time.NewTimer(b.timeout)
		defer t.Stop()
		left, expired = nil, t.C
	}
	select {
	case b.calls <- c:
		return nil
	case <-left:
		return fmt.Errorf("%w: %w", ErrOverloaded, c.ctx.Err())
	case <-expired:
		return fmt.Errorf("%w: %w", ErrOverloaded, context.DeadlineExceeded)
	case <-b.stop:
		return errBatcherStopped
	}
}

// answered is o, the outcome c's caller takes; an error after which the
// call may have run goes to c's orphan handler too.
func (c *call) answered(o outcome) outcome {
	if o.err != nil && c.orphan != nil && !errors.Is(o.err, ErrOverloaded) {
		done := make(chan outcome, 1)
		done <- o
		c.orphan(done)
	}
	return o
}

// late is the outcome of a queued call whose wait ended by err.
func (c *call) late(err error) outcome {
	select {
	case o := <-c.done: // decided (and maybe charged) just in time
		return c.answered(o)
	default:
	}
	if c.sent.Load() {
		if c.orphan != nil {
			c.orphan(c.done) // every call taken from the queue gets an outcome
		}
		return outcome{err: err} // the store was too slow
	}
	if errors.Is(err, errBatcherStopped) {
		return outcome{err: err}
	}
	return outcome{err: fmt.Errorf("%w: %w", ErrOverloaded, err)}
}

// errBatcherStopped answers the calls a batcher stopped before sending:
// its server left the cluster (see Limiter.sweep) or the limiter closed.
var errBatcherStopped = errors.New("the server's batcher stopped: it left the cluster, or the limiter closed")

func (b *batcher) close() {
	close(b.stop)
	b.workers.Wait()
}

func (b *batcher) work() {
	batch := make([]*call, 0, 64)
	for {
		var stopped bool
		batch, stopped = b.collectBatch(batch[:0])
		if stopped {
			return
		}
		if len(batch) > 0 {
			b.inflight.Add(1)
			b.exec(batch)
			b.inflight.Add(-1)
			select {
			case b.landed <- struct{}{}:
			default:
			}
		}
	}
}

// collectBatch takes the next batch from the queue, as the one worker
// collecting, and reports whether the batcher stopped instead.
func (b *batcher) collectBatch(batch []*call) ([]*call, bool) {
	b.collect.Lock()
	defer b.collect.Unlock()
	hits := 0
	select {
	case <-b.stop:
		return batch, true
	case c := <-b.calls:
		batch, hits = b.add(batch, c, hits)
	}
more:
	for hits < maxBatchHits {
		select {
		case c := <-b.calls:
			batch, hits = b.add(batch, c, hits)
		default:
			break more
		}
	}
	// A token from a batch that landed before now would end the gathering
	// early: only one landing after the look at inflight counts.
	select {
	case <-b.landed:
	default:
	}
	if b.inflight.Load() > 0 {
		batch = b.gather(batch, hits)
	}
	return batch, false
}

// gather adds the calls that come while another batch is in flight to
// batch, of hits hits, until that batch lands or this one is full, and no
// later than the deadline of any call in it without a late form.
func (b *batcher) gather(batch []*call, hits int) []*call {
	if len(batch) == 0 {
		return batch
	}
	end := time.Now().Add(b.timeout) // a call with a late form waits for no caller
	for _, c := range batch {
		if c.lateArgs == nil && c.deadline.Before(end) {
			end = c.deadline
		}
	}
	t := time.NewTimer(time.Until(end))
	defer t.Stop()
	for hits < maxBatchHits {
		select {
		case c := <-b.calls:
			n := len(batch)
			batch, hits = b.add(batch, c, hits)
			if len(batch) > n && c.lateArgs == nil && c.deadline.Before(end) {
				end = c.deadline
				t.Reset(time.Until(end))
			}
		case <-b.landed:
			return batch
		case <-t.C:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

// add appends c to batch unless its caller has already been answered (it
// left, or its deadline passed), which sending it would charge for a
// request answered by failure mode; a call with a late form goes in it.
func (b *batcher) add(batch []*call, c *call, hits int) ([]*call, int) {
	c.sent.Store(true) // before the check: a caller that saw it unset was not sent (but in its late form)
	err := c.ctx.Err()
	if err == nil && !time.Now().Before(c.deadline) {
		err = context.DeadlineExceeded
	}
	if err != nil && c.lateArgs == nil {
		c.done <- outcome{err: fmt.Errorf("%w: %w", ErrOverloaded, err)}
		return batch, hits
	}
	return append(batch, c), hits + len(c.keys)
}
