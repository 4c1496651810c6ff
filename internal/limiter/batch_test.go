package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// request is one request of a decide call, in decide.lua's argument form.
type request struct {
	hits   []Hit
	charge bool
}

func decideCall(t *testing.T, client *redis.Client, reqs ...request) [][4]int64 {
	t.Helper()
	var keys []string
	var args []any
	for _, r := range reqs {
		n := len(r.hits)
		if !r.charge {
			n = -n
		}
		args = append(args, n)
		for _, h := range r.hits {
			keys = append(keys, h.Key)
			arg, err := hitArg(&h, &requestRule{}, epoch)
			if err != nil {
				t.Fatal(err)
			}
			args = append(args, arg)
		}
	}
	vals, err := decideScript.Run(context.Background(), client, keys, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	out := make([][4]int64, len(vals)/4)
	for i := range out {
		copy(out[i][:], vals[4*i:])
	}
	return out
}

// decideClient returns a client of a fresh miniredis whose clock is at start.
func decideClient(t *testing.T, start time.Time) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m, _ := luastore.RunT(t)
	m.SetTime(start)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	return m, client
}

// TestOneCallDecidesRequestsInOrder: a batch holding a burst at one key is
// decided as if the requests had come one by one, each all or nothing.
func TestOneCallDecidesRequestsInOrder(t *testing.T) {
	const (
		denied  = 0
		checked = 1 // admitted, not charged
		charged = 2
	)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			_, client := decideClient(t, epoch.Add(time.Second))
			hot := hit(a, "hot", 3, time.Minute, 1)
			other := hit(a, "other", 10, time.Minute, 1)
			heavy := hit(a, "hot", 3, time.Minute, 2)
			got := decideCall(t, client,
				request{hits: []Hit{hot}, charge: true},        // 1 used
				request{hits: []Hit{hot, other}, charge: true}, // 2 used
				request{hits: []Hit{heavy}, charge: true},      // 2 more do not fit
				request{hits: []Hit{hot}, charge: false},       // fits, a check only
				request{hits: []Hit{hot}, charge: true},        // 3 used
				request{hits: []Hit{other, hot}, charge: true}, // denied: other not charged
				request{hits: []Hit{hot}, charge: true},        // denied again (from the call's memory)
			)
			states := []int64{charged, charged, charged, denied, checked, charged, checked, denied, denied}
			remaining := []int64{2, 1, 9, 1, 1, 0, 9, 0, 0}
			for i := range states {
				if got[i][0] != states[i] || got[i][1] != remaining[i] {
					t.Errorf("hit %d: state %d remaining %d, want %d and %d", i, got[i][0], got[i][1], states[i], remaining[i])
				}
			}
			if got[7][2] <= 0 || got[8][2] != got[7][2] {
				t.Errorf("waits of the two denials of hot: %d and %d µs, want the same, positive", got[7][2], got[8][2])
			}
			// What the call left in Redis: 3 on hot, 1 on other.
			after := decideCall(t, client, request{hits: []Hit{hit(a, "hot", 3, time.Minute, 0), hit(a, "other", 10, time.Minute, 0)}})
			if after[0][1] != 0 || after[1][1] != 9 {
				t.Fatalf("after the call: %d left on hot, %d on other; want 0 and 9", after[0][1], after[1][1])
			}
		})
	}
}

// TestLogMembersOfOneCallStayDistinct: the log records every unit charged
// by one call at one TIME under its own member.
func TestLogMembersOfOneCallStayDistinct(t *testing.T) {
	m, client := decideClient(t, epoch)
	h := hit(config.SlidingWindowLog, "same", 10, time.Minute, 1)
	w := hit(config.SlidingWindowLog, "same", 10, time.Minute, 3)
	decideCall(t, client, request{hits: []Hit{h}, charge: true}, request{hits: []Hit{w}, charge: true}, request{hits: []Hit{h}, charge: true})
	if n := m.Exists(h.Key); !n {
		t.Fatal("no log key")
	}
	members, err := m.ZMembers(h.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 5 {
		t.Fatalf("%d members %v, want 5", len(members), members)
	}
}

// TestWindowCountersSurviveAClockStepBack: after a failover to a host whose
// clock is behind, a counter written in a later window keeps its counts
// (reading it as empty would admit a full window again) and its index.
func TestWindowCountersSurviveAClockStepBack(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			m, client := decideClient(t, epoch.Add(time.Minute+time.Second)) // window 1
			h := hit(a, "step", 3, time.Minute, 1)
			decideCall(t, client, request{hits: []Hit{h, hit(a, "other", 3, time.Minute, 1)}, charge: true}, request{hits: []Hit{h}, charge: true})
			m.SetTime(epoch.Add(59 * time.Second)) // back into window 0
			got := decideCall(t, client, request{hits: []Hit{h}, charge: true}, request{hits: []Hit{h}, charge: true})
			if got[0][0] != 2 || got[0][1] != 0 || got[1][0] != 0 {
				t.Fatalf("after the step back: %v, want the third unit charged and the fourth denied", got)
			}
			v, err := client.Get(context.Background(), h.Key).Result()
			if err != nil || v[:strings.IndexByte(v, ':')] != fmt.Sprint(epoch.Add(time.Minute).Unix()/60) {
				t.Fatalf("stored %q (%v), want the later window's index kept", v, err)
			}
		})
	}
}

// TestLogExpirySetOncePerCall: a log key charged by several requests of one
// call lives until its newest member leaves the window, whether the call
// created it, found it with a shorter life, or found it made persistent.
func TestLogExpirySetOncePerCall(t *testing.T) {
	m, client := decideClient(t, epoch)
	h := hit(config.SlidingWindowLog, "hot", 100, time.Minute, 1)
	// Three charges in one microsecond: members at now, now+1 and now+2 µs.
	want := time.Minute + time.Millisecond // ceil((2 µs + 1 min) / 1 ms)
	for _, before := range []string{"created", "shorter life", "persistent"} {
		switch before {
		case "shorter life":
			m.FastForward(30 * time.Second)
			m.SetTime(epoch.Add(30 * time.Second))
		case "persistent":
			if err := client.Persist(context.Background(), h.Key).Err(); err != nil {
				t.Fatal(err)
			}
		}
		decideCall(t, client,
			request{hits: []Hit{h}, charge: true},
			request{hits: []Hit{h}, charge: true},
			request{hits: []Hit{h}, charge: true},
		)
		if ttl := m.TTL(h.Key); ttl != want {
			t.Errorf("%s: TTL %v, want %v", before, ttl, want)
		}
	}
}
