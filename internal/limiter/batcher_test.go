package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// pipelineCounter counts the pipelines a client sends and their largest size.
type pipelineCounter struct {
	pipelines, largest atomic.Int64
}

func (*pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.pipelines.Add(1)
		for n := int64(len(cmds)); ; {
			largest := p.largest.Load()
			if n <= largest || p.largest.CompareAndSwap(largest, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

func TestConcurrentCallsSharePipelines(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	var counter pipelineCounter
	client.AddHook(&counter)
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1})
	defer l.Close()
	if err := decideScript.Load(context.Background(), client).Err(); err != nil {
		t.Fatal(err)
	}

	const calls = 400
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := make(chan struct{})
	for i := 0; i < calls; i++ {
		wg.Go(func() {
			<-start
			h := hit(config.SlidingWindowLog, fmt.Sprint(i), 5, time.Minute, 1)
			if v, err := l.Decide(context.Background(), []Hit{h}); err != nil || !v[0].Charged {
				failed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d calls failed", failed.Load(), calls)
	}
	t.Logf("%d calls in %d pipelines, the largest of %d", calls, counter.pipelines.Load(), counter.largest.Load())
	if counter.largest.Load() < 2 || counter.pipelines.Load() >= calls {
		t.Fatalf("%d calls in %d pipelines, the largest of %d: concurrent calls did not share pipelines",
			calls, counter.pipelines.Load(), counter.largest.Load())
	}
}

func TestNoScriptInABatchIsResentOnce(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1})
	defer l.Close()
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		if err := client.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 50; i++ {
			wg.Go(func() {
				if _, err := l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "flush", 1000, time.Minute, 1)}); err != nil {
					t.Errorf("after SCRIPT FLUSH: %v", err)
				}
			})
		}
		wg.Wait()
	}
	if v := decide1(t, l, hit(config.FixedWindow, "flush", 1000, time.Minute, 0)); v.Remaining != 850 {
		t.Fatalf("remaining %d, want 850: every call counted exactly once", v.Remaining)
	}
}

// TestCallerDeadlineWhileABatchStalls: a caller is answered when its own
// deadline passes, even if the batch it joined is stuck.
func TestCallerDeadlineWhileABatchStalls(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: stalledServer(t), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	l := New(client, &Options{Timeout: 2 * time.Second}) // the batch's own deadline
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	v, err := l.Decide(ctx, []Hit{hit(config.FixedWindow, "x", 5, time.Minute, 1)})
	if err == nil || !v[0].FailureVerdict {
		t.Fatalf("verdict %+v, error %v: want a failure verdict", v, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("answered after %v, want about the caller's 50ms", took)
	}
}

// TestCallsWhoseCallerLeftAreNotSent: calls that queued behind a stalled
// batch until their callers' deadlines passed are dropped, not charged late.
func TestCallsWhoseCallerLeftAreNotSent(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	b := newBatcher(client, 5*time.Second, singleRouter{client}.node, nil)
	defer b.close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := &call{ctx: ctx, script: decideScript, done: make(chan outcome, 1)}
	if batch, _ := b.add(nil, c, 0); len(batch) != 0 {
		t.Fatal("a call whose caller left joined a batch")
	}
	if err := (<-c.done).err; !errors.Is(err, ErrOverloaded) {
		t.Fatalf("the dropped call got error %v, want ErrOverloaded", err)
	}
}

// TestAFailureBeforeSendingIsTheCommandsError: go-redis reports a pipeline
// that failed before sending (here a wrong password) only from Exec; the
// commands must carry that error, not a puzzling empty reply.
func TestAFailureBeforeSendingIsTheCommandsError(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.RequireAuth("secret")
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), Password: "wrong", MaxRetries: -1})
	defer client.Close()
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1})
	defer l.Close()
	_, err := l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "auth", 5, time.Minute, 1)})
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") || ErrorKind(err) != "redis" {
		t.Fatalf("error %v (kind %q), want Redis's WRONGPASS, of kind redis", err, ErrorKind(err))
	}
}

// TestSendsGroupDecidesBySlot: a batch's decide requests become one decide
// per slot, in the order the slots first appear, each holding its slot's
// requests in queue order; a script call goes on its own.
func TestSendsGroupDecidesBySlot(t *testing.T) {
	const script = -1 // a script call, not a decide request
	for _, tc := range []struct {
		name  string
		slots []int
		want  [][]int // the calls of each send, by index in the batch
	}{
		{"one call", []int{0}, [][]int{{0}}},
		{"one slot", []int{0, 0, 0}, [][]int{{0, 1, 2}}},
		{"slots interleaved", []int{5, 7, 5, 9, 7, 5}, [][]int{{0, 2, 5}, {1, 4}, {3}}},
		{"a script among them", []int{3, script, 3, 4}, [][]int{{0, 2}, {1}, {3}}},
		{"scripts only", []int{script, script}, [][]int{{0}, {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch := make([]*call, len(tc.slots))
			index := map[*call]int{}
			for i, slot := range tc.slots {
				c := &call{ctx: context.Background(), deadline: time.Now().Add(time.Hour), slot: slot, keys: []string{fmt.Sprint(i)}, args: []any{i}}
				if slot == script {
					c.script = refundScript
				}
				batch[i], index[c] = c, i
			}
			sends := (&batcher{}).sends(batch)
			if len(sends) != len(tc.want) {
				t.Fatalf("%d sends, want %d", len(sends), len(tc.want))
			}
			for j, s := range sends {
				if !s.build(time.Now()) {
					t.Fatalf("send %d: no call left to send", j)
				}
				var got []int
				var keys []string
				var args []any
				for _, c := range s.calls {
					got = append(got, index[c])
					keys = append(keys, fmt.Sprint(index[c]))
					args = append(args, index[c])
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want[j]) {
					t.Errorf("send %d holds calls %v, want %v", j, got, tc.want[j])
				}
				if fmt.Sprint(s.keys) != fmt.Sprint(keys) || fmt.Sprint(s.args) != fmt.Sprint(args) {
					t.Errorf("send %d has keys %v and args %v, want %v and %v: its calls' in order", j, s.keys, s.args, keys, args)
				}
			}
		})
	}
}

// TestBuildLeavesOutLateCalls: a decide send is built, each time it goes,
// from the calls still worth sending: one whose caller left or whose
// deadline passed is answered ErrOverloaded and left out, but one with a
// late form, which goes in that form (here the limiter's: a check, its hit
// count negative), and one in time goes as it is.
func TestBuildLeavesOutLateCalls(t *testing.T) {
	now := time.Now()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	mk := func(key string, ctx context.Context, deadline time.Time, owed bool, n int) *call {
		c := &call{ctx: ctx, deadline: deadline, keys: []string{key}, records: []string{key + ":slices"},
			args: []any{n, "3:ce:10:1:1"}, done: make(chan outcome, 1)}
		if owed {
			c.lateArgs = []any{-n, "3:ce:10:1:1"}
		}
		return c
	}
	calls := []*call{
		mk("live", live, now.Add(time.Second), false, 1),
		mk("past", live, now.Add(-time.Millisecond), false, 1),
		mk("left", gone, now.Add(time.Second), false, 1),
		mk("owed-past", live, now.Add(-time.Millisecond), true, 1),
		mk("owed-left", gone, now.Add(time.Second), true, 1),
		mk("owed-live", live, now.Add(time.Second), true, 1),
		mk("check", live, now.Add(time.Second), false, -1),
	}
	s := &send{calls: slices.Clone(calls)}
	if !s.build(now) {
		t.Fatal("build left no call")
	}
	want := []any{1, "3:ce:10:1:1", -1, "3:ce:10:1:1", -1, "3:ce:10:1:1", 1, "3:ce:10:1:1", -1, "3:ce:10:1:1"}
	wantKeys := []string{"live", "owed-past", "owed-left", "owed-live", "check",
		"live:slices", "owed-past:slices", "owed-left:slices", "owed-live:slices", "check:slices"}
	if fmt.Sprint(s.args) != fmt.Sprint(want) || fmt.Sprint(s.keys) != fmt.Sprint(wantKeys) {
		t.Fatalf("built args %v keys %v, want %v %v", s.args, s.keys, want, wantKeys)
	}
	for _, c := range calls {
		dropped := c.keys[0] == "past" || c.keys[0] == "left"
		select {
		case o := <-c.done:
			if !dropped || !errors.Is(o.err, ErrOverloaded) {
				t.Errorf("%s: answered %v at build", c.keys[0], o.err)
			}
		default:
			if dropped {
				t.Errorf("%s: left out without an answer", c.keys[0])
			}
		}
	}
	if (&send{calls: []*call{mk("past", live, now.Add(-time.Millisecond), false, 1)}}).build(now) {
		t.Error("a send of late calls only: built, want none left")
	}
}
