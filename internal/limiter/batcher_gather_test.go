package limiter

import (
	"context"
	"testing"
	"time"
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
			b := &batcher{calls: make(chan *call, 16), landed: make(chan struct{}, 1), stop: make(chan struct{})}
			b.inflight.Store(tc.inflight)
			if tc.stale {
				b.landed <- struct{}{}
			}
			b.calls <- newCall(tc.deadline)
			got := make(chan []*call, 1)
			go func() {
				batch, _ := b.collectBatch(nil)
				got <- batch
			}()
			for range tc.later {
				b.calls <- newCall(tc.deadline)
			}
			if tc.lands {
				// Only once the collector took every call (or left without
				// them: then the count below tells).
				for len(b.calls) > 0 && len(got) == 0 {
					time.Sleep(time.Millisecond)
				}
				b.landed <- struct{}{}
			}
			select {
			case batch := <-got:
				if len(batch) != tc.want {
					t.Fatalf("a batch of %d calls, want %d", len(batch), tc.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the batch never went")
			}
		})
	}
}
