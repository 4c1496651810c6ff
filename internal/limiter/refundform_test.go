package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// commandLog records the script and function calls a client sends, as
// "<command> <function or SHA>" ("eval" alone), with their outcome.
type commandLog struct {
	mu   sync.Mutex
	sent []string
}

func (*commandLog) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range cmds {
			switch c.Name() {
			case "fcall", "evalsha":
				l.sent = append(l.sent, fmt.Sprintf("%s %v: %v", c.Name(), c.Args()[1], c.Err()))
			case "eval":
				l.sent = append(l.sent, fmt.Sprintf("eval: %v", c.Err()))
			}
		}
		return err
	}
}

// TestRefundForms: a give-back reaches Redis as the library's refund
// function; after the library is lost (a restart, FUNCTION FLUSH) it
// loads it again and calls the function; on a store that runs no
// functions, it runs as the Refund script (sent whole when the store has
// not seen it). In each, the charge comes back.
func TestRefundForms(t *testing.T) {
	refunds := func(f string) string { return "fcall " + lua.RefundFunction() + ": " + f }
	for _, tc := range []struct {
		name      string
		functions bool // the store runs Redis Functions (luastore); else miniredis's own scripts alone
		flush     bool // the library is lost between the charge and its give-back
		want      []string
	}{
		{name: "function", functions: true, want: []string{refunds("<nil>")}},
		{name: "library lost", functions: true, flush: true, want: []string{refunds("ERR Function not found"), refunds("<nil>")}},
		{name: "scripts only", want: []string{"evalsha " + refundScript.Hash() + ": NOSCRIPT No matching script. Please use EVAL.", "eval: <nil>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			if tc.functions {
				s, err := luastore.Install(m)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
			}
			m.SetTime(epoch)
			client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
			t.Cleanup(func() { client.Close() })
			log := &commandLog{}
			client.AddHook(log)
			l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1})
			t.Cleanup(l.Close)
			ctx := context.Background()

			h := hit(config.FixedWindow, "u", 10, time.Minute, 4)
			v, err := l.Decide(ctx, []Hit{h})
			if err != nil || !v[0].Charged {
				t.Fatalf("the charge: %+v, %v", v, err)
			}
			if tc.flush {
				if err := client.FunctionFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			log.mu.Lock()
			log.sent = nil
			log.mu.Unlock()
			l.undo(ctx, "test", []Hit{h}, []int{0}, v, []bool{true})
			l.refunds.Wait()
			log.mu.Lock()
			sent := slices.Clone(log.sent)
			log.mu.Unlock()
			if !slices.Equal(sent, tc.want) {
				t.Errorf("sent %q, want %q", sent, tc.want)
			}
			h.Cost = 0
			if v := decide1(t, l, h); v.Remaining != 10 {
				t.Errorf("%d left after the give-back, want 10", v.Remaining)
			}
		})
	}
}
