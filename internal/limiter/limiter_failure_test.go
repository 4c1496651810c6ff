package limiter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/redisstore"
)

func TestScriptFlushIsTransparent(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowCounter, "flush", 100, time.Minute, 1)
	for i := 0; i < 5; i++ {
		if i == 2 {
			if err := l.router.(singleRouter).client.(*redis.Client).ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		decide1(t, l, h)
	}
	if v := decide1(t, l, hit(config.SlidingWindowCounter, "flush", 100, time.Minute, 0)); v.Remaining != 95 {
		t.Fatalf("remaining %d, want 95", v.Remaining)
	}
}

func TestStoreDownAnswersByFailureMode(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	c.m.Close()
	allow := hit(config.FixedWindow, "allow", 5, time.Minute, 1)
	deny := hit(config.FixedWindow, "deny", 5, time.Minute, 1)
	deny.FailureMode = config.FailureDeny
	tooBig := hit(config.FixedWindow, "big", 5, time.Minute, 6) // allow, yet never admissible
	start := time.Now()
	v, err := l.Decide(context.Background(), []Hit{allow, deny, tooBig})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "connection" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind connection", err, ErrorKind(err))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	want := []Verdict{
		{FailureVerdict: true, Admitted: true, Remaining: 5},
		{FailureVerdict: true, ResetAfter: FailureRetry},
		{CostExceedsLimit: true, ResetAfter: time.Minute},
	}
	for i := range want {
		if v[i] != want[i] {
			t.Errorf("verdict %d: %+v, want %+v", i, v[i], want[i])
		}
	}
}

// TestNoRetryAfterALostReply: the script is not idempotent, so a reply lost
// with its connection must not make the client run it again.
func TestNoRetryAfterALostReply(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	// The proxy relays both ways until a script call passes: it forwards
	// that one, then drops the connection instead of relaying the reply.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", m.Addr())
			if err != nil {
				_ = conn.Close() // the client sees its connection end
				return
			}
			var scriptSent atomic.Bool
			go func() {
				defer conn.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := upstream.Read(buf)
					if err != nil || scriptSent.Load() {
						return
					}
					if _, err := conn.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			go func() {
				defer upstream.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := conn.Read(buf)
					if err != nil {
						return
					}
					if lower := bytes.ToLower(buf[:n]); bytes.Contains(lower, []byte("eval")) || bytes.Contains(lower, []byte("fcall")) {
						scriptSent.Store(true)
					}
					if _, err := upstream.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	directClient := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer directClient.Close()
	direct := New(directClient, nil)
	defer direct.Close()
	// Loaded, so that the proxied call (FCALL, or EVALSHA where functions
	// are refused) runs rather than meeting a missing function or NOSCRIPT.
	if err := loadLibrary(context.Background(), directClient); err != nil {
		t.Fatal(err)
	}
	if err := decideScript.Load(context.Background(), directClient).Err(); err != nil {
		t.Fatal(err)
	}
	store, err := redisstore.Open(redisstore.Config{URL: "redis://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	l := New(store.Client, &Options{Timeout: 5 * time.Second})
	defer l.Close()
	h := hit(config.FixedWindow, "once", 10, time.Minute, 1)
	if _, err := l.Decide(context.Background(), []Hit{h}); !errors.Is(err, ErrStore) {
		t.Fatalf("error %v, want ErrStore for a lost reply", err)
	}
	got, err := direct.Decide(context.Background(), []Hit{hit(config.FixedWindow, "once", 10, time.Minute, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Remaining != 9 {
		t.Fatalf("remaining %d: the request was charged %d times, want once", got[0].Remaining, 10-got[0].Remaining)
	}
}

func TestStoreDeadline(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: stalledServer(t), ContextTimeoutEnabled: true})
	defer client.Close()
	l := New(client, &Options{Timeout: 50 * time.Millisecond})
	defer l.Close()
	start := time.Now()
	_, err := l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "x", 5, time.Minute, 1)})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "timeout" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind timeout", err, ErrorKind(err))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("stalled store answered after %v, want about the 50ms deadline", d)
	}
}

func TestRedisErrorsAreObservedWithTheirKind(t *testing.T) {
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	var observed []error
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1, Observe: func(_ time.Duration, err error) { observed = append(observed, err) }})
	defer l.Close()
	h := hit(config.SlidingWindowLog, "typed", 5, time.Minute, 1)
	decide1(t, l, h)
	m.Del(h.Key)
	if err := m.Set(h.Key, "a string where the log keeps a sorted set"); err != nil {
		t.Fatal(err)
	}
	_, err := l.Decide(context.Background(), []Hit{h})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "redis" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind redis", err, ErrorKind(err))
	}
	if len(observed) != 2 || observed[0] != nil || observed[1] == nil {
		t.Fatalf("observed %v, want a success then the failure", observed)
	}
}

// TestErrorKindOfNoErrorAllocatesNothing: it runs for every store call.
func TestErrorKindOfNoErrorAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { ErrorKind(nil) }); n != 0 {
		t.Fatalf("ErrorKind(nil) allocates %v times", n)
	}
}

func TestErrorKindOfACancelledCall(t *testing.T) {
	if k := ErrorKind(fmt.Errorf("%w: %w", ErrStore, context.Canceled)); k != "canceled" {
		t.Fatalf("kind %q, want canceled", k)
	}
}

// stalledServer returns the address of a listener that accepts connections
// and never answers: a stalled Redis.
func stalledServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	return ln.Addr().String()
}
