package limiter

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

func reset1(t *testing.T, l *Limiter, h Hit) int64 {
	t.Helper()
	n, err := l.Reset(context.Background(), h)
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	return n
}

// TestResetRestoresTheWholeLimit fills a counter across a window edge, so
// that the counter algorithms hold a previous and a current window, then
// resets it: a check sees the whole limit, and the whole limit is admitted.
func TestResetRestoresTheWholeLimit(t *testing.T) {
	const limit = 10
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(-10*time.Second))
			h := hit(a, "r", limit, time.Minute, 4)
			other := hit(a, "other", limit, time.Minute, 1)
			decide1(t, l, h)
			c.set(epoch.Add(10 * time.Second))
			decide1(t, l, h)
			decide1(t, l, other)
			check := h
			check.Cost = 0
			if v := decide1(t, l, check); v.Remaining >= limit-1 {
				t.Fatalf("before the reset: %+v, want most of the limit used", v)
			}
			keep := c.m.Keys()
			keep = slices.DeleteFunc(keep, func(k string) bool { return !strings.HasPrefix(k, other.Key) })
			counters := len(c.m.Keys()) - len(keep)

			if n := reset1(t, l, h); n != int64(counters) {
				t.Fatalf("Reset deleted %d keys, want %d (all of %q but %q)", n, counters, c.m.Keys(), keep)
			}
			if keys := heldKeys(c); !slices.Equal(keys, keep) {
				t.Fatalf("keys after the reset %q, want only the other counter's %q", keys, keep)
			}
			if v := decide1(t, l, check); !v.Admitted || v.Remaining != limit || v.ResetAfter != 0 {
				t.Fatalf("check after the reset: %+v, want the whole limit (%d) now", v, limit)
			}
			full := h
			full.Cost = limit
			if v := decide1(t, l, full); !v.Admitted || !v.Charged || v.Remaining != 0 {
				t.Fatalf("the whole limit after the reset: %+v, want admitted and charged", v)
			}
			if v := decide1(t, l, hit(a, "other", limit, time.Minute, 0)); v.Remaining != limit-1 {
				t.Fatalf("other counter after the reset: %+v, want untouched (%d left)", v, limit-1)
			}
		})
	}
}

// TestResetAtTheWindowStart: one microsecond into a window, the previous
// window is the one the counter weighs most.
func TestResetAtTheWindowStart(t *testing.T) {
	l, c := newTestLimiter(t, epoch.Add(-time.Microsecond))
	h := hit(config.SlidingWindowCounter, "edge", 5, time.Minute, 5)
	decide1(t, l, h)
	c.set(epoch)
	check := h
	check.Cost = 0
	if v := decide1(t, l, check); v.Remaining != 0 {
		t.Fatalf("before the reset: %+v, want nothing left", v)
	}
	if n := reset1(t, l, h); n != 1 {
		t.Fatalf("Reset deleted %d keys, want the previous window's", n)
	}
	if v := decide1(t, l, check); v.Remaining != 5 {
		t.Fatalf("after the reset: %+v, want 5 left", v)
	}
}

func TestResetOfAnEmptyCounter(t *testing.T) {
	for _, a := range algorithms {
		l, _ := newTestLimiter(t, epoch)
		if n := reset1(t, l, hit(a, "none", 5, time.Hour, 0)); n != 0 {
			t.Fatalf("%s: Reset of nothing deleted %d keys", a, n)
		}
	}
}

func TestResetAfterScriptFlush(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "flush", 5, time.Minute, 1)
	decide1(t, l, h)
	reset1(t, l, h)
	decide1(t, l, h)
	if err := l.router.(singleRouter).client.(*redis.Client).ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if n := reset1(t, l, h); n != 1 || len(c.m.Keys()) != 0 {
		t.Fatalf("Reset after SCRIPT FLUSH deleted %d, keys left %q", n, c.m.Keys())
	}
}

func TestResetErrors(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	if _, err := l.Reset(context.Background(), Hit{Window: time.Minute}); err == nil || errors.Is(err, ErrStore) {
		t.Fatalf("empty key: %v, want a non-store error", err)
	}
	c.m.Close()
	if _, err := l.Reset(context.Background(), hit(config.FixedWindow, "down", 5, time.Minute, 0)); !errors.Is(err, ErrStore) {
		t.Fatalf("store down: %v, want ErrStore", err)
	}
}

func TestResetIsObserved(t *testing.T) {
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	var observed []error
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1, Observe: func(_ time.Duration, err error) { observed = append(observed, err) }})
	defer l.Close()
	reset1(t, l, hit(config.FixedWindow, "o", 5, time.Minute, 0))
	if len(observed) != 1 || observed[0] != nil {
		t.Fatalf("observed %v, want one successful store call", observed)
	}
}
