package limiter

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the script calls of concurrent requests to one server in
// shared pipelines: one write and one read for many scripts, which costs
// Redis and the service far fewer system calls per decision than a round
// trip each. It batches naturally: a worker takes the first waiting call and
// whatever else is already queued (up to maxBatch), never waiting for more,
// so an idle server adds no latency and a busy one gets deep pipelines.
// Several workers keep several pipelines in flight.
//
// A call is sent once and never replayed: after a lost connection its result
// is an error, answered by failure mode, because a decide script run twice
// would charge twice. (go-redis's own autopipeliner may replay a sent
// command after a connection loss.)
type batcher struct {
	server   redis.UniversalClient
	calls    chan *call
	maxBatch int
	timeout  time.Duration
	stop     chan struct{}
	workers  sync.WaitGroup
}

// call is one script call waiting for its batch.
type call struct {
	ctx    context.Context // the caller's: a call whose caller left is not sent
	script *redis.Script
	keys   []string
	args   []any
	done   chan *redis.Cmd // buffered: a worker never waits for the caller
}

const (
	batchWorkers = 8
	maxBatch     = 64
)

func newBatcher(server redis.UniversalClient, timeout time.Duration) *batcher {
	b := &batcher{
		server:   server,
		calls:    make(chan *call, 4*maxBatch*batchWorkers),
		maxBatch: maxBatch,
		timeout:  timeout,
		stop:     make(chan struct{}),
	}
	for range batchWorkers {
		b.workers.Go(b.work)
	}
	return b
}

// do runs script on the server in the next batch and returns its command,
// or an error command when ctx ends first.
func (b *batcher) do(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan *redis.Cmd, 1)}
	select {
	case b.calls <- c:
	case <-ctx.Done():
		return errCmd(ctx, ctx.Err())
	}
	select {
	case cmd := <-c.done:
		return cmd
	case <-ctx.Done():
		return errCmd(ctx, ctx.Err())
	}
}

func (b *batcher) close() {
	close(b.stop)
	b.workers.Wait()
}

func (b *batcher) work() {
	batch := make([]*call, 0, b.maxBatch)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.calls:
			batch = b.add(batch[:0], c)
		}
	more:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.calls:
				batch = b.add(batch, c)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			b.exec(batch)
		}
	}
}

// add appends c to batch unless its caller has already been answered (its
// deadline passed while it queued behind a stalled server): sending it now
// would charge a request that was answered by failure mode.
func (b *batcher) add(batch []*call, c *call) []*call {
	if err := c.ctx.Err(); err != nil {
		c.done <- errCmd(c.ctx, err)
		return batch
	}
	return append(batch, c)
}

// deadline is the latest of the batch's callers' deadlines, at most the
// store timeout from now: past it, every caller has been answered, and a
// script still sent would charge requests answered by failure mode.
func (b *batcher) deadline(batch []*call) time.Time {
	limit := time.Now().Add(b.timeout)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return limit
		}
		if d.After(latest) {
			latest = d
		}
	}
	if latest.After(limit) {
		return limit
	}
	return latest
}

// exec sends one batch as a pipeline of EVALSHA, and re-sends as EVAL, in a
// second pipeline, the calls that met NOSCRIPT (a restart, a failover or
// SCRIPT FLUSH emptied the script cache): those were not run.
func (b *batcher) exec(batch []*call) {
	ctx, cancel := context.WithDeadline(context.Background(), b.deadline(batch))
	defer cancel()
	cmds := make([]*redis.Cmd, len(batch))
	pipe := b.server.Pipeline()
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, err := pipe.Exec(ctx)
	failCommandsNotRun(cmds, err)
	var again []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := b.server.Pipeline()
		for _, i := range again {
			cmds[i] = batch[i].script.Eval(ctx, pipe, batch[i].keys, batch[i].args...)
		}
		_, err := pipe.Exec(ctx)
		failCommandsNotRun(cmds, err)
	}
	for i, c := range batch {
		c.done <- cmds[i]
	}
}

// failCommandsNotRun gives the pipeline's error to the commands it left
// without an answer: go-redis reports a failure before sending (a refused
// connection, a wrong password) only from Exec, and leaves the commands
// untouched.
func failCommandsNotRun(cmds []*redis.Cmd, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		if cmd.Err() == nil && cmd.Val() == nil {
			cmd.SetErr(err)
		}
	}
}

func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
