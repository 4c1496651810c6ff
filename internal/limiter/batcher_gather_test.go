package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// TestGather: a batch goes at once when no other is in flight, and gathers
// the calls that come while one is, until it lands (a token of an earlier
// landing does not count) or a call's deadline comes.
func TestGather(t *testing.T) {
	newCall := func(deadline time.Duration) *call {
		return &call{ctx: context.Background(), deadline: time.Now().Add(deadline), keys: []string{"k"}, done: make(chan outcome, 1)}
	}
	for _, tc := range []struct {
		name     string
		inflight int32
		stale    bool          // a token of an earlier landing waits in landed
		deadline time.Duration // of the calls
		later    int           // calls queued while the batch is collected
		lands    bool          // the batch in flight lands once they are taken
		want     int           // calls in the batch
	}{
		{name: "none in flight: at once", deadline: time.Minute, want: 1},
		{name: "one in flight: until it lands", inflight: 1, deadline: time.Minute, later: 3, lands: true, want: 4},
		{name: "an earlier landing does not count", inflight: 1, stale: true, deadline: time.Minute, later: 2, lands: true, want: 3},
		{name: "one in flight: until a call's deadline", inflight: 1, deadline: 50 * time.Millisecond, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A call taken after its deadline is answered, not sent (add):
			// on a machine too busy to take the first call within its
			// deadline (the short one's case), the run tells nothing and
			// goes again with twice the deadline.
			for deadline := tc.deadline; ; deadline *= 2 {
				// The store timeout bounds the gathering (gather): a minute,
				// so that only a landing or a call's deadline ends it.
				b := &batcher{calls: make(chan *call, 16), timeout: time.Minute, landed: make(chan struct{}, 1), stop: make(chan struct{})}
				b.inflight.Store(tc.inflight)
				if tc.stale {
					b.landed <- struct{}{}
				}
				first := newCall(deadline)
				b.calls <- first
				got := make(chan []*call, 1)
				go func() {
					batch, _ := b.collectBatch(nil)
					got <- batch
				}()
				if tc.later > 0 {
					// The later calls are queued only once the collector took
					// the first one; with a stale token, only once it drained
					// that token, which it does after it took what was queued
					// and before it gathers: then the gathering alone can take
					// them, and the stale token (were it not drained) would
					// end it without them.
					if !waitfor.True(30*time.Second, time.Millisecond, func() bool {
						return len(b.calls) == 0 && (!tc.stale || len(b.landed) == 0) || len(got) > 0
					}) {
						t.Fatal("the collector never took the first call")
					}
				}
				for range tc.later {
					b.calls <- newCall(deadline)
				}
				if tc.lands {
					// Only once the collector took every call (or left without
					// them: then the count below tells).
					if !waitfor.True(30*time.Second, time.Millisecond, func() bool { return len(b.calls) == 0 || len(got) > 0 }) {
						t.Fatal("the collector never took the later calls")
					}
					// Then the batch in flight lands, as work tells it: a
					// token offered, not waited for. Without a stale token,
					// the collector may not have drained landed yet (it took
					// the calls before it looks): a token it drained is
					// offered again, until the batch goes.
					waitfor.True(30*time.Second, time.Millisecond, func() bool {
						select {
						case b.landed <- struct{}{}:
						default:
						}
						return len(got) > 0
					})
				}
				var batch []*call
				select {
				case batch = <-got:
				case <-time.After(30 * time.Second):
					t.Fatal("the batch never went")
				}
				if len(batch) == 0 && len(first.done) > 0 && deadline < time.Minute {
					t.Logf("the first call was taken after its deadline of %v (a busy machine): again with %v", deadline, 2*deadline)
					continue
				}
				if len(batch) != tc.want {
					t.Fatalf("a batch of %d calls, want %d", len(batch), tc.want)
				}
				return
			}
		})
	}
}
