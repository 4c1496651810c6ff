package fairshare

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// store client that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is a miniredis's Redis TIME, set by the test.
type clock struct {
	m   *miniredis.Miniredis
	now time.Time
}

func (c *clock) set(t time.Time) {
	c.now = t
	c.m.SetTime(t)
}

func (c *clock) add(d time.Duration) { c.set(c.now.Add(d)) }

// newTestLimiter returns a limiter on a fresh miniredis whose clock starts
// at start.
func newTestLimiter(t *testing.T, start time.Time) (*limiter.Limiter, *clock) {
	t.Helper()
	m, _ := luastore.RunT(t)
	// A dial is tried once: the tests that stop the store wait for its
	// failure, not for retries.
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	c := &clock{m: m}
	c.set(start)
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second})
	t.Cleanup(l.Close)
	return l, c
}

// epoch is a whole hour.
var epoch = time.Unix(1_700_006_400, 0)
