package e2e

// What the fault tests (faults_test.go) share: their redis-server, a load
// that records every call, the kinds of answer, host freezes, and the
// checks of what a load saw.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// faultLimit is far above any load of these tests: a decided answer is
// always OK, so that an OVER_LIMIT can only come from a failure mode.
const faultLimit = 1_000_000_000

// faultConfig: one rule that fails open, one that fails closed and one that
// names no failure mode (Envoy's decides), all fixed windows (their Redis
// value is the exact number of charges), and a small exact limit for
// correctness checks after a fault.
// faultConfig's rules keep off hot keys' slices (hot_key_slices: false):
// the fault tests watch each hit's store call, which a slice would save
// (slices under an outage: hotkeys' TestSlicesOutlastAnOutage).
var faultConfig = fmt.Sprintf(`
domain: faults
descriptors:
  - key: open_when_down
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: fixed_window, failure_mode: allow, hot_key_slices: false}
  - key: closed_when_down
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: fixed_window, failure_mode: deny, hot_key_slices: false}
  - key: envoy_when_down
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: fixed_window, hot_key_slices: false}
  - key: kept
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log, failure_mode: deny, hot_key_slices: false}
`, faultLimit)

const (
	// faultStoreTimeout is the service's --store-timeout in the fault tests.
	faultStoreTimeout = 200 * time.Millisecond
	// faultMargin is what an answer may take beyond the store deadline: a
	// gRPC round trip and the response, in race-detector builds of both
	// the service and the test, on a busy CI machine. Generous on purpose:
	// what is asserted is that answers are bounded (an unbounded one waits
	// out the whole 2 s stall or outage), not how fast they are.
	faultMargin = time.Second
	// faultWorkers clients send requests concurrently, each pausing
	// faultPause between requests (a few thousand requests a second).
	faultWorkers = 8
	faultPause   = 2 * time.Millisecond
	// A load goes on until it has had this many decided answers: in its
	// warm-up, before a fault, and after the store is back.
	faultWarmCalls   = 1000
	faultBeforeCalls = 500
	faultAfterCalls  = 1000
	// faultAdminName is the client name of the test's own Redis
	// connections, so that CLIENT LIST can tell the service's apart.
	faultAdminName = "e2e-admin"
)

// faultStartRedis starts redis-server on a free loopback port with extra
// arguments; its client is named faultAdminName and waits up to 5 s for a
// reply (DEBUG SLEEP).
func faultStartRedis(t *testing.T, extra ...string) *redisServer {
	t.Helper()
	port := freePort(t)
	return startRedisArgs(t, "127.0.0.1:"+strconv.Itoa(port),
		&redis.Options{ClientName: faultAdminName, ReadTimeout: 5 * time.Second},
		append([]string{"--port", strconv.Itoa(port)}, extra...)...)
}

// faultRestartRedis starts a new redis-server with the arguments of r's
// last one (so on the same port, empty: nothing is saved) once r's process
// is gone, and returns when it says it accepts connections (the test's own
// client would add its dial backoff). startRedisArgs's cleanup stops it.
func faultRestartRedis(t *testing.T, r *redisServer) {
	t.Helper()
	r.stop()
	cmd := exec.Command(r.cmd.Path, r.cmd.Args[1:]...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.cmd = cmd
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("restarted redis-server output:\n%s", out)
		}
	})
	if !eventually(5*time.Second, func() bool { return strings.Contains(out.String(), "Ready to accept connections") }) {
		t.Fatalf("redis-server not ready after 5s:\n%s", out)
	}
}

// faultServiceConns counts the connections Redis has from anyone but the
// test itself: the service's.
func faultServiceConns(t *testing.T, r *redisServer) int {
	t.Helper()
	list, err := r.client.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if line != "" && !strings.Contains(line, " name="+faultAdminName+" ") {
			n++
		}
	}
	return n
}

// faultProcess is what the leak check compares: the service's goroutines
// (go_goroutines on /metrics), open file descriptors, and connections to Redis.
type faultProcess struct{ goroutines, fds, conns int }

func faultSample(t *testing.T, s *server, r *redisServer) faultProcess {
	t.Helper()
	g, err := strconv.ParseFloat(metric(t, s, "go_goroutines"), 64)
	if err != nil {
		t.Fatalf("go_goroutines: %v", err)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return faultProcess{goroutines: int(g), fds: len(fds), conns: faultServiceConns(t, r)}
}

// faultSettled samples the service until two samples in a row agree: the
// calls of a load that has stopped are over, their goroutines gone.
func faultSettled(t *testing.T, s *server, r *redisServer) faultProcess {
	t.Helper()
	last := faultSample(t, s, r)
	eventually(5*time.Second, func() bool {
		now := faultSample(t, s, r)
		same := now.goroutines == last.goroutines && now.fds == last.fds
		last = now
		return same
	})
	return last
}

// waitStalled returns once Redis has stopped answering (a DEBUG SLEEP has
// begun): a PING on a connection of its own times out.
func waitStalled(t *testing.T, r *redisServer) {
	t.Helper()
	probe := redis.NewClient(&redis.Options{
		Addr: r.addr, ClientName: faultAdminName, ReadTimeout: 100 * time.Millisecond, MaxRetries: -1, PoolSize: 1,
	})
	defer probe.Close()
	waitFor(t, 5*time.Second, func() error {
		err := probe.Ping(context.Background()).Err()
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil
		}
		if err == nil {
			return errors.New("Redis still answers PING")
		}
		return err
	})
}

// faultCall is one request of a load and its answer.
type faultCall struct {
	start, end time.Time
	resp       *rlsv3.RateLimitResponse
	err        error
}

func (c faultCall) took() time.Duration { return c.end.Sub(c.start) }

// faultLoad runs workers clients asking next() in a loop until stop.
type faultLoad struct {
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	calls []faultCall // in the order they ended, until stop sorts them
}

func faultStartLoad(s *server, workers int, next func() *rlsv3.RateLimitRequest) *faultLoad {
	l := &faultLoad{done: make(chan struct{})}
	for range workers {
		l.wg.Go(func() {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c := faultCall{start: time.Now()}
				c.resp, c.err = s.rls.ShouldRateLimit(ctx, next())
				c.end = time.Now()
				cancel()
				l.mu.Lock()
				l.calls = append(l.calls, c)
				l.mu.Unlock()
				if !pause(l.done, faultPause) {
					return
				}
			}
		})
	}
	return l
}

// faultLoadWait bounds waitCalls: long enough for a busy 2-core machine.
const faultLoadWait = 20 * time.Second

// waitCalls waits until n calls of the load have ended with an answer of
// kind (by classify) that ended after from, for at most faultLoadWait, and
// says whether they did. It fails nothing: what the load saw is checked
// once it stops.
func (l *faultLoad) waitCalls(n int, kind faultKind, classify func(*rlsv3.RateLimitResponse) faultKind, from time.Time) bool {
	seen, counted := 0, 0 // calls looked at, and of them the ones that count
	return eventually(faultLoadWait, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.calls[seen:] {
			if c.err == nil && c.end.After(from) && classify(c.resp) == kind {
				counted++
			}
		}
		seen = len(l.calls)
		return counted >= n
	})
}

// stop ends the load and returns its calls in the order they started.
func (l *faultLoad) stop() []faultCall {
	close(l.done)
	l.wg.Wait()
	slices.SortFunc(l.calls, func(a, b faultCall) int { return a.start.Compare(b.start) })
	return l.calls
}

// An answer is decided by Redis, or given by the rules' failure modes.
type faultKind int

const (
	decided faultKind = iota
	byFailureMode
	malformed
)

func (k faultKind) String() string {
	return [...]string{"decided", "failure mode", "malformed"}[k]
}

// faultPair asks for one descriptor of the rule that fails open and one of
// the rule that fails closed, in one request: one store call decides both.
func faultPair(value string) *rlsv3.RateLimitRequest {
	return request("faults", descriptor("open_when_down", value), descriptor("closed_when_down", value))
}

// classifyPair tells a decided answer to faultPair (both OK and charged)
// from a failure-mode one (allow: OK with the whole limit left and no reset;
// deny: OVER_LIMIT with retry-after 1). Anything else is malformed, a mixed
// answer among them: both descriptors share one store call.
func classifyPair(resp *rlsv3.RateLimitResponse) faultKind {
	if len(resp.Statuses) != 2 {
		return malformed
	}
	open, closed := resp.Statuses[0], resp.Statuses[1]
	retry, _ := headerValue(resp, "retry-after")
	switch {
	case resp.OverallCode == ok && open.Code == ok && closed.Code == ok &&
		open.LimitRemaining < faultLimit && closed.LimitRemaining < faultLimit:
		return decided
	case resp.OverallCode == over && retry == "1" &&
		open.Code == ok && open.LimitRemaining == faultLimit && open.DurationUntilReset.AsDuration() == 0 &&
		closed.Code == over && closed.LimitRemaining == 0 && closed.DurationUntilReset.AsDuration() == time.Second:
		return byFailureMode
	}
	return malformed
}

// classifyClosed does the same for a request of one closed_when_down descriptor.
func classifyClosed(resp *rlsv3.RateLimitResponse) faultKind {
	if len(resp.Statuses) != 1 {
		return malformed
	}
	st := resp.Statuses[0]
	retry, _ := headerValue(resp, "retry-after")
	switch {
	case resp.OverallCode == ok && st.Code == ok && st.LimitRemaining < faultLimit:
		return decided
	case resp.OverallCode == over && retry == "1" && st.Code == over && st.DurationUntilReset.AsDuration() == time.Second:
		return byFailureMode
	}
	return malformed
}

// freezes watches for moments when the test process could not run: a
// goroutine sleeps 5 ms in a loop and records every wake-up more than 20 ms
// late. On a machine shared with other work (two cores, race detector), the
// host sometimes stops everything for a few hundred ms; an answer that
// overlaps such a moment is given that much more time, and no more, so a
// slow service is still caught.
type freezes struct {
	mu    sync.Mutex
	spans [][2]time.Time // from when the wake-up was due to when it came
	done  chan struct{}
	wg    sync.WaitGroup
}

func watchFreezes(t *testing.T) *freezes {
	f := &freezes{done: make(chan struct{})}
	f.wg.Go(func() {
		const tick = 5 * time.Millisecond
		for {
			due := time.Now().Add(tick)
			select {
			case <-f.done:
				return
			case <-time.After(tick):
			}
			if woke := time.Now(); woke.Sub(due) > 20*time.Millisecond {
				f.mu.Lock()
				f.spans = append(f.spans, [2]time.Time{due, woke})
				f.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() {
		close(f.done)
		f.wg.Wait()
	})
	return f
}

// during returns how long the test process was frozen between from and to.
func (f *freezes) during(from, to time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	for _, s := range f.spans {
		if lo, hi := later(s[0], from), earlier(s[1], to); hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

// longest returns the longest freeze seen.
func (f *freezes) longest() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	for _, s := range f.spans {
		d = max(d, s[1].Sub(s[0]))
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// checkCalls fails on any gRPC error, malformed answer, or answer slower
// than maxTook (plus any host freeze it overlapped); it returns the kind of
// each call and the slowest answer.
func checkCalls(t *testing.T, f *freezes, calls []faultCall, classify func(*rlsv3.RateLimitResponse) faultKind,
	maxTook time.Duration) ([]faultKind, time.Duration) {
	t.Helper()
	kinds := make([]faultKind, len(calls))
	var slowest time.Duration
	errs, bad, slow, excused := 0, 0, 0, 0
	for i, c := range calls {
		slowest = max(slowest, c.took())
		if c.took() > maxTook {
			if frozen := f.during(c.start, c.end); c.took() <= maxTook+frozen {
				excused++
			} else if slow++; slow <= 3 {
				t.Errorf("an answer took %v, more than %v (+%v of host freeze; started %v)", c.took(), maxTook, frozen, c.start.Format("15:04:05.000"))
			}
		}
		if c.err != nil {
			if errs++; errs <= 3 {
				t.Errorf("a gRPC error reached a client: %v", c.err)
			}
			kinds[i] = malformed
			continue
		}
		if kinds[i] = classify(c.resp); kinds[i] == malformed {
			if bad++; bad <= 3 {
				t.Errorf("an answer neither decided nor by failure mode: %v", c.resp)
			}
		}
	}
	if errs+bad+slow > 0 {
		t.Errorf("%d calls: %d gRPC errors, %d malformed answers, %d slower than %v", len(calls), errs, bad, slow, maxTook)
	}
	if excused > 0 {
		t.Logf("%d answers slower than %v during host freezes (longest freeze %v), given the frozen time", excused, maxTook, f.longest())
	}
	return kinds, slowest
}

// recovery checks the calls around the return of a working store at back:
// the first decided answer ending after it comes within recoveryBound (plus
// any host freeze meanwhile), and every call starting recoveryBound after
// it is decided. It returns that first answer's delay after back, which the
// tests log: how fast recovery is depends on how busy the machine is; that
// it comes without a restart does not.
// recoveryBound is how soon after the store's return decisions must be back:
// the client reconnects at once, so seconds are a margin for a busy machine.
const recoveryBound = 5 * time.Second

func recovery(t *testing.T, f *freezes, calls []faultCall, kinds []faultKind, back time.Time) time.Duration {
	t.Helper()
	first := time.Duration(-1)
	late := 0
	for i, c := range calls {
		if first < 0 && kinds[i] == decided && c.end.After(back) {
			first = c.end.Sub(back)
		}
		if c.start.After(back.Add(recoveryBound)) && kinds[i] != decided {
			late++
		}
	}
	switch {
	case first < 0:
		t.Fatal("no decided answer after the store came back")
	case first >= recoveryBound+f.during(back, back.Add(first)):
		t.Errorf("first decided answer %v after the store came back, want < %v", first, recoveryBound)
	}
	if late > 0 {
		t.Errorf("%d answers started more than %v after the store came back were not decided", late, recoveryBound)
	}
	return first
}

// countIn counts the calls of kind that started after from and ended before to.
func countIn(calls []faultCall, kinds []faultKind, from, to time.Time) (n, of int) {
	for i, c := range calls {
		if c.start.After(from) && c.end.Before(to) {
			of++
			if kinds[i] == byFailureMode {
				n++
			}
		}
	}
	return n, of
}

// fixedCount sums the fixed-window counters of rule=value: the exact number
// of units charged (the sum covers a day edge crossed mid-test).
func fixedCount(t *testing.T, r *redisServer, rule, value string) int64 {
	t.Helper()
	return windowCount(t, r.client, "rl:{faults|"+rule+"="+value+"}:fixed:86400")
}

// hitKept asks the kept rule (5 per hour, exact) n times for value, which
// already has from hits: OK counting down to 0 left, then OVER_LIMIT with
// the oldest hit's hour as the wait. Decisions are correct.
func hitKept(t *testing.T, s *server, value string, from, n int) {
	t.Helper()
	for i := range n {
		hit := from + i + 1
		st := s.ask(t, request("faults", descriptor("kept", value))).Statuses[0]
		if left := 5 - hit; left >= 0 && (st.Code != ok || st.LimitRemaining != uint32(left)) {
			t.Fatalf("kept=%s hit %d: %v, want OK with %d left", value, hit, st, left)
		}
		if wait := st.DurationUntilReset.AsDuration(); hit > 5 && (st.Code != over || wait <= 59*time.Minute || wait > time.Hour) {
			t.Fatalf("kept=%s hit %d: %v, want OVER_LIMIT until the oldest hit is an hour old", value, hit, st)
		}
	}
}
