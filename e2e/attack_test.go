package e2e

// Attacks on the gRPC port by one client that speaks HTTP/2 badly (issue
// 22). Envoy fails open when its rate limit calls fail, so an attack that
// makes the service stop answering lifts every limit: whatever an attacker
// does to its own connections, other clients' calls are answered, a new
// connection is served, connections that break the protocol or never
// finish their handshake are closed, and peers that never read cannot
// make the service hold memory without bound. Each attack runs against
// both servers --grpc-server offers.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/slidingwindow/ratelimit/internal/h2attack"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

const attackConfig = `
domain: attack
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

// attackRSSBound is the most resident memory the service may hold while
// the peers of a flood leave its answers unread: docs/reliability.md's
// bound for an attacker's peers.
const attackRSSBound = 128 << 20

// Durations of the attacks: long enough for their effect to show on a
// busy machine, short enough for the whole test to stay within a few
// minutes. The preface-only attack waits for the handshake deadline,
// which no flag shortens.
const (
	attackFor    = 3 * time.Second // make bench-attacks: ATTACK_FOR
	trickleFor   = 5 * time.Second // past the second trickle tick
	handshakeFor = 12 * time.Second
	protocolFor  = 2 * time.Second // the server answers these at once
)

// legitCall is the legitimate clients' request: a counter of its own, far
// from its limit.
var legitCall = h2attack.Call{Domain: "attack", Key: "k", Value: "legit"}

// attackCall is an attacker's whole call, on a counter of its own.
var attackCall = h2attack.Call{Domain: "attack", Key: "k", Value: "attacker"}

// attackCase is one attack and what the service must do about it beyond
// answering the legitimate clients.
type attackCase struct {
	name     string
	runFor   time.Duration
	deadline time.Duration // the legitimate calls'; see measuring
	// plain runs the service without the race detector, whose memory
	// would distort a memory bound. Against grpc-go's server every attack
	// runs plain: the race detector is there for our HTTP/2 code, and it
	// made that half of the suite cost as much CPU again as the lean half.
	plain  bool
	attack func(ctx context.Context, addr string) h2attack.Result
	// check asserts what is particular to the attack; leanOnly: on the
	// lean server only, where it is a bound of ours and not one grpc-go's
	// server keeps (docs/reliability.md has its figures).
	check    func(t *testing.T, res h2attack.Result, peakRSS int64)
	leanOnly bool
	// args are the service's flags beyond the harness's; boundFull says
	// that they make it refuse new connections during the attack, so a
	// connection dialed then is not served by design; metrics checks
	// the service's /metrics after the attack.
	args      []string
	boundFull bool
	metrics   func(t *testing.T, s *server)
	// notOnGRPCGo, when set, says why the attack is not run against
	// grpc-go's server.
	notOnGRPCGo string
	// grpcGoLimit, when set, says why grpc-go's server does not keep the
	// legitimate calls answered under this attack (measured in
	// docs/reliability.md): there they are logged, not asserted.
	grpcGoLimit string
}

var attackCases = []attackCase{
	{
		name: "trickle", runFor: trickleFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Trickle(ctx, addr, h2attack.TrickleOptions{Conns: 1, Streams: 1000, Interval: 4 * time.Second, Timeout: h2attack.HugeTimeout})
		},
	},
	{
		name: "headers only", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.HeadersOnly(ctx, addr, h2attack.HeadersOnlyOptions{Conns: 8})
		},
	},
	{
		name: "length prefix", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.LengthPrefix(ctx, addr, h2attack.LengthPrefixOptions{Streams: 1000, Announced: 262000, Sent: 16})
		},
	},
	{
		name: "continuation", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Continuation(ctx, addr, h2attack.ContinuationOptions{})
		},
		check: mustClose,
	},
	{
		name: "settings flood", runFor: attackFor, plain: true,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Flood(ctx, addr, h2attack.FloodOptions{Peers: 64, Frame: h2attack.FloodSettings})
		},
		check: rssUnder(attackRSSBound), leanOnly: true,
		grpcGoLimit: "under it, 98.4-98.6 % of the calls were answered within 50 ms in make bench-attacks, some after seconds",
	},
	{
		// Peers that never read, within --max-connections' default: the
		// service stays under its soft memory limit. Not the bound of a
		// few peers: with GOGC=400 the heap grows to five times what is
		// live between collections, and what 1,000 connections keep live
		// makes that, beside busy legitimate callers, near it (116 MiB
		// on a quiet machine).
		name: "unread peers", runFor: attackFor, plain: true,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Unread(ctx, addr, h2attack.UnreadOptions{Call: attackCall, Peers: 1000, Calls: 1})
		},
		check:       rssUnder(settings.DefaultMemoryLimit),
		notOnGRPCGo: "what its connections hold is grpc-go's; the bound on their number, the same listener, is checked on both below",
	},
	{
		// Past --max-connections: connections closed at accept, counted;
		// those open before are served.
		name: "past max connections", runFor: attackFor,
		args: []string{"--max-connections", "100"}, boundFull: true,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Unread(ctx, addr, h2attack.UnreadOptions{Call: attackCall, Peers: 1000, Calls: 1})
		},
		metrics: func(t *testing.T, s *server) {
			t.Helper()
			// The legitimate clients hold two of the 100 places.
			if v, _ := strconv.ParseFloat(metric(t, s, `ratelimit_transport_refusals_total{reason="connections"}`), 64); v < 900 {
				t.Errorf("ratelimit_transport_refusals_total{reason=\"connections\"} = %v, want at least 900 of 1000 peers past 100 connections", v)
			}
			if v := metric(t, s, "ratelimit_grpc_connections"); v == "" {
				t.Errorf("no ratelimit_grpc_connections")
			}
		},
	},
	{
		name: "ping flood", runFor: attackFor, plain: true,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Flood(ctx, addr, h2attack.FloodOptions{Peers: 64, Frame: h2attack.FloodPing})
		},
		check: rssUnder(attackRSSBound), leanOnly: true,
		grpcGoLimit: "it closes the flooding peers (too_many_pings), which reconnect at once",
	},
	{
		name: "preface only", runFor: handshakeFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.PrefaceOnly(ctx, addr, h2attack.PrefaceOnlyOptions{})
		},
		check: mustClose,
	},
	{
		name: "rapid reset", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.RapidReset(ctx, addr, h2attack.RapidResetOptions{Message: true})
		},
		grpcGoLimit: "under a rapid reset it answered 27-60 % of the calls within 50 ms in make bench-attacks",
	},
	{
		name: "hpack bomb", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.HPACKBomb(ctx, addr, h2attack.HPACKBombOptions{})
		},
	},
	{
		name: "zero window", runFor: attackFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.ZeroWindow(ctx, addr, h2attack.ZeroWindowOptions{Streams: 1000})
		},
	},
	{
		name: "oversized frame", runFor: protocolFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.OversizedFrame(ctx, addr, h2attack.OversizedFrameOptions{})
		},
		// grpc-go's server closes such a connection without a GOAWAY;
		// the lean one says why.
		check: func(t *testing.T, res h2attack.Result, _ int64) {
			mustClose(t, res, 0)
			if len(res.GoAways) > 0 && !res.GoAway(http2.ErrCodeFrameSize) {
				t.Errorf("GOAWAY other than FRAME_SIZE_ERROR for a frame past SETTINGS_MAX_FRAME_SIZE: %v", res)
			}
		},
	},
	invalidCase(h2attack.DataOnStreamZero),
	invalidCase(h2attack.HeadersOnEvenStream),
	invalidCase(h2attack.WindowUpdateZero),
}

// invalidCase sends a frame HTTP/2 makes a connection error: the
// connection must close, after a GOAWAY PROTOCOL_ERROR if a GOAWAY comes
// (RFC 9113 says a server should send one, not that it must).
func invalidCase(frame h2attack.InvalidFrame) attackCase {
	return attackCase{
		name: frame.String(), runFor: protocolFor,
		attack: func(ctx context.Context, addr string) h2attack.Result {
			return h2attack.Invalid(ctx, addr, h2attack.InvalidOptions{Frame: frame})
		},
		check: func(t *testing.T, res h2attack.Result, _ int64) {
			mustClose(t, res, 0)
			for code := range res.GoAways {
				if code != http2.ErrCodeProtocol {
					t.Errorf("GOAWAY %v, want PROTOCOL_ERROR: %v", code, res)
				}
			}
			if len(res.GoAways) == 0 {
				t.Logf("closed without a GOAWAY")
			}
		},
	}
}

// mustClose: the server closed the attacker's connection.
func mustClose(t *testing.T, res h2attack.Result, _ int64) {
	t.Helper()
	if res.Closed == 0 {
		t.Errorf("the attacker's connection was never closed: %v", res)
	}
}

// rssUnder: the service's resident memory stayed under bound.
func rssUnder(bound int64) func(t *testing.T, res h2attack.Result, peakRSS int64) {
	return func(t *testing.T, res h2attack.Result, peakRSS int64) {
		t.Helper()
		if peakRSS >= bound {
			t.Errorf("peak RSS %d MiB, want under %d MiB: %v", peakRSS>>20, bound>>20, res)
		}
	}
}

// attackRow is one run's line of the summary.
type attackRow struct {
	server, attack string
	started        bool
	legit          h2attack.LegitResult
	res            h2attack.Result
	peakRSS        int64
	plain          bool
	pass           bool
}

// measuring reports the settings of a measurement run (make
// bench-attacks): ATTACK_FOR, how long each attack lasts (the attacks of
// preface-only and protocol-error attacks keep theirs), and ATTACK_DEADLINE,
// the legitimate calls' deadline, as Envoy's. Such a run serves without
// the race detector and asserts what the test asserts, against those.
func measuring(t *testing.T) (runFor, deadline time.Duration, on bool) {
	runFor, deadline = attackFor, 5*time.Second
	for _, v := range []struct {
		name string
		d    *time.Duration
	}{{"ATTACK_FOR", &runFor}, {"ATTACK_DEADLINE", &deadline}} {
		if s := os.Getenv(v.name); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			*v.d, on = d, true
		}
	}
	return runFor, deadline, on
}

// TestAttack runs every attack against each --grpc-server, one at a time,
// with eight legitimate callers beside it whose calls have a deadline of
// five seconds (a bound on a failure, not a latency goal: the test must
// pass on a busy machine). At least 99 % of their calls are answered (OK
// or OVER_LIMIT), a connection dialed during the attack is served (but on
// grpc-go's server under the attacks where it is the limit: grpcGoLimit),
// and each attack's own guarantee holds (see attackCases).
func TestAttack(t *testing.T) {
	began := time.Now()
	runFor, deadline, measure := measuring(t)
	var (
		mu   sync.Mutex
		rows []attackRow
	)
	// The two servers are attacked side by side, each by one attack at a
	// time, except when measuring: "servers" returns when both are done.
	t.Run("servers", func(t *testing.T) {
		for _, kind := range []string{"lean", "grpc-go"} {
			t.Run(kind, func(t *testing.T) {
				if !measure {
					t.Parallel()
				}
				for _, tc := range attackCases {
					if kind == "grpc-go" {
						if tc.notOnGRPCGo != "" {
							continue
						}
						tc.plain = true
					}
					if measure {
						tc.plain = true
						if tc.runFor == attackFor {
							tc.runFor = runFor
						}
					}
					tc.deadline = deadline
					row := attackRow{server: kind, attack: tc.name, plain: tc.plain}
					row.pass = t.Run(tc.name, func(t *testing.T) { runAttack(t, kind, tc, &row) })
					mu.Lock()
					rows = append(rows, row)
					mu.Unlock()
				}
			})
		}
	})
	t.Logf("attacks against both servers took %v:\n%s", time.Since(began).Round(time.Second), attackTable(rows))
}

// runAttack starts redis and the service, runs tc's attack and the
// legitimate clients side by side, and checks the outcome into row.
func runAttack(t *testing.T, kind string, tc attackCase, row *attackRow) {
	r := startRedis(t)
	// Info, not the harness's debug: a line per refused stream would slow
	// the service under attack and bury the failure report. Under the
	// test's long deadline, the store's timeout is that deadline: what is
	// under test is the port, not how fast Redis answers on a loaded machine
	// (the default second ran out there, and failure modes answered). A
	// measurement (make bench-attacks, Envoy's deadline) keeps the default.
	args := append([]string{"--grpc-server", kind, "--log-level", "info"}, tc.args...)
	if tc.deadline > limiter.DefaultTimeout {
		args = append(args, "--store-timeout", tc.deadline.String())
	}
	var s *server
	if tc.plain {
		s = startPlainServer(t, r, attackConfig, args...)
	} else {
		s = startServer(t, r, attackConfig, args...)
	}
	row.started = true

	dialCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	legit, err := h2attack.DialLegit(dialCtx, s.grpcAddr, legitCall)
	if err != nil {
		t.Fatalf("before the attack: %v", err)
	}
	defer legit.Close()

	ctx, stop := context.WithTimeout(context.Background(), tc.runFor)
	defer stop()
	attacked := make(chan h2attack.Result, 1)
	go func() { attacked <- tc.attack(ctx, s.grpcAddr) }()
	sampled := make(chan int64, 1)
	go func() { sampled <- peakRSS(ctx, s.cmd.Process.Pid) }()
	lr := legit.Run(ctx, h2attack.LegitOptions{Call: legitCall, Callers: 8, Deadline: tc.deadline})
	res := <-attacked
	row.legit, row.res, row.peakRSS = lr, res, <-sampled

	t.Logf("attack: %v", res)
	t.Logf("legitimate clients: %v", lr)
	t.Logf("peak RSS %d MiB%s", row.peakRSS>>20, map[bool]string{true: "", false: " (race detector)"}[tc.plain])

	select {
	case err := <-s.exited:
		s.exited <- err
		t.Fatalf("the service exited during the attack: %v", err)
	default:
	}
	if res.Err != nil {
		t.Errorf("the attack could not run as meant: %v", res.Err)
	}
	if lr.Calls == 0 {
		t.Fatalf("no legitimate call was made")
	}
	share := lr.AnsweredShare()
	if tc.boundFull {
		share = lr.DialedBeforeShare() // a new connection is refused by design
	}
	if kind == "grpc-go" && tc.grpcGoLimit != "" {
		t.Logf("grpc-go's server is the limit here (%s): %.2f%% answered, %d of %d on a new connection",
			tc.grpcGoLimit, 100*share, lr.NewConnAnswered, lr.NewConnCalls)
	} else {
		if share < 0.99 {
			t.Errorf("%.2f%% of the legitimate calls answered, want at least 99%%: %v", 100*share, lr)
		}
		if lr.NewConnAnswered == 0 && !tc.boundFull {
			t.Errorf("a connection dialed during the attack was not served: %v", lr)
		}
	}
	if tc.check != nil && (kind == "lean" || !tc.leanOnly) {
		tc.check(t, res, row.peakRSS)
	}
	if tc.metrics != nil {
		tc.metrics(t, s)
	}
}

// peakRSS samples the resident memory of process pid until ctx ends and
// returns the most it saw.
func peakRSS(ctx context.Context, pid int) int64 {
	var peak int64
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if rss, err := procStatus(pid, "VmRSS"); err == nil {
			peak = max(peak, rss)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return peak
		}
	}
}

// attackTable is the summary of the runs, as a Markdown table.
func attackTable(rows []attackRow) string {
	var b strings.Builder
	b.WriteString("| attack | server | legit answered | legit latency mean / max | new conn served | attacker closed | GOAWAY | peak RSS | result |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		result := "pass"
		if !r.pass {
			result = "FAIL"
		}
		if !r.started {
			if r.pass {
				continue // not run: left out by -run
			}
			fmt.Fprintf(&b, "| %s | %s | - | - | - | - | - | - | FAIL (did not start) |\n", r.attack, r.server)
			continue
		}
		closed := "no"
		if r.res.Closed > 0 {
			closed = fmt.Sprintf("yes (%d, first after %v)", r.res.Closed, r.res.FirstClose.Round(100*time.Millisecond))
		}
		var goAways []string
		for _, code := range slices.Sorted(maps.Keys(r.res.GoAways)) {
			goAways = append(goAways, code.String())
		}
		rss := fmt.Sprintf("%d MiB", r.peakRSS>>20)
		if !r.plain {
			rss += " (race)"
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f%% of %d | %v / %v | %d/%d | %s | %s | %s | %s |\n",
			r.attack, r.server, 100*r.legit.AnsweredShare(), r.legit.Calls,
			r.legit.MeanLatency.Round(time.Millisecond), r.legit.MaxLatency.Round(time.Millisecond),
			r.legit.NewConnAnswered, r.legit.NewConnCalls, closed, strings.Join(goAways, ", "), rss, result)
	}
	return b.String()
}
