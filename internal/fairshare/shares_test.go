package fairshare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

const shareKey = "test:k_v:rlqs"

// shareReq is a request of member on shareKey for 100 units a minute, with
// Envoy's report interval and a 10 s lease.
func shareReq(member string, demand float64, current uint64) ShareRequest {
	return ShareRequest{
		Key: shareKey, Member: member, Demand: demand, Limit: 100, Window: time.Minute,
		Current: current, ReportInterval: 5 * time.Second, Lease: 10 * time.Second,
	}
}

func share1(t *testing.T, l *limiter.Limiter, r ShareRequest) Share {
	t.Helper()
	s, err := Assign(context.Background(), l, r)
	if err != nil {
		t.Fatalf("Share(%+v): %v", r, err)
	}
	return s
}

// shareEntry is one member's registry entry as the script writes it.
type shareEntry struct {
	demand          float64
	tokens, size    uint64
	leaseEnd        time.Time // ms of Redis TIME
	formattedDemand string
}

func (e shareEntry) String() string {
	return fmt.Sprintf("%s %d %d %d", strconv.FormatFloat(e.demand, 'f', -1, 64), e.tokens, e.size, e.leaseEnd.UnixMilli())
}

// seed writes entries into the registry directly, as other members' calls
// would have.
func seed(t *testing.T, m *miniredis.Miniredis, entries map[string]shareEntry) {
	t.Helper()
	for member, e := range entries {
		m.HSet(shareKey, member, e.String())
	}
}

// registry reads every shareEntry back.
func registry(t *testing.T, m *miniredis.Miniredis) map[string]shareEntry {
	t.Helper()
	got := map[string]shareEntry{}
	if !m.Exists(shareKey) {
		return got
	}
	keys, err := m.HKeys(shareKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		f := strings.Fields(m.HGet(shareKey, k))
		if len(f) != 4 {
			t.Fatalf("shareEntry %s = %q, want 4 fields", k, m.HGet(shareKey, k))
		}
		d, err1 := strconv.ParseFloat(f[0], 64)
		tokens, err2 := strconv.ParseUint(f[1], 10, 64)
		size, err3 := strconv.ParseUint(f[2], 10, 64)
		end, err4 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatalf("shareEntry %s: %v", k, err)
		}
		got[k] = shareEntry{demand: d, tokens: tokens, size: size, leaseEnd: time.UnixMilli(end), formattedDemand: f[0]}
	}
	return got
}

// TestShareWaterFilling: a member's share is its max-min fair share of the
// limit among the live members' demands. The others hold no T here, so
// that no cap hides the share.
func TestShareWaterFilling(t *testing.T) {
	live := epoch.Add(5 * time.Second)
	idle := func(demands ...float64) map[string]shareEntry {
		m := map[string]shareEntry{}
		for i, d := range demands {
			m[fmt.Sprintf("other%d", i)] = shareEntry{demand: d, leaseEnd: live}
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		others map[string]shareEntry
		demand float64
		want   uint64
	}{
		{"alone, unknown demand", nil, -1, 100},
		{"alone, small demand", nil, 30, 30},
		{"alone, no demand: at least 1", nil, 0, 1},
		{"alone, a demand above the limit", nil, 1e9, 100},
		{"alone, an infinite demand", nil, math.Inf(1), 100},
		{"alone, NaN: unknown", nil, math.NaN(), 100},
		{"equal demands", idle(50, 50, 50, 50), 50, 20},
		{"equal demands, a fraction rounded up", idle(50, 50), 50, 34},
		{"skewed: the big one gets what the small leave", idle(10, 20), 200, 70},
		{"skewed: a small one gets its demand", idle(90, 90), 10, 10},
		{"a fractional demand rounded up", idle(90, 90), 2.5, 3},
		{"unknown among known: as if it wanted the whole limit", idle(10, 30), -1, 60},
		{"unknown among unknown: an equal share", idle(-1, -1), -1, 34},
		{"a known demand among unknown ones", idle(-1, -1, -1), 40, 25},
		{"an other's demand above the limit counts as the limit", idle(1e9), 80, 50},
		{"an expired other counts for nothing", map[string]shareEntry{"gone": {demand: 100, tokens: 100, leaseEnd: epoch}}, 100, 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			seed(t, c.m, tt.others)
			s := share1(t, l, shareReq("me", tt.demand, 0))
			if s.Tokens != tt.want {
				t.Fatalf("Tokens %d, want %d (%+v)", s.Tokens, tt.want, s)
			}
			if got := registry(t, c.m)["me"]; got.tokens != tt.want || got.size != s.MaxTokens || !got.leaseEnd.Equal(epoch.Add(10*time.Second)) {
				t.Fatalf("own shareEntry %+v, want T %d, M %d, lease end now + 10 s", got, tt.want, s.MaxTokens)
			}
		})
	}
}

// TestShareHysteresis: a member keeps the T it holds while the new share is
// at most a fifth below it (when that leaves the others their fair shares)
// or at most 5 % above it, but never past the cap.
func TestShareHysteresis(t *testing.T) {
	for _, tt := range []struct {
		name          string
		others        map[string]shareEntry
		demand        float64
		current, want uint64
	}{
		{"no current: the share", nil, 100, 0, 100},
		{"up 4%: kept", nil, 100, 96, 96},
		{"up 11%: changed", nil, 100, 90, 100},
		{"up 25%: changed", nil, 100, 80, 100},
		{"down 17%: kept", nil, 50, 60, 60},
		{"down 20% exactly: kept", nil, 40, 50, 50},
		{"up 25% from 40: changed", nil, 50, 40, 50},
		{"down 17%, but another lacks its fair share: changed",
			map[string]shareEntry{"other": {demand: 50, tokens: 45, leaseEnd: epoch.Add(time.Second)}}, 100, 55, 50},
		{"the cap wins over the kept T", map[string]shareEntry{"other": {demand: 95, tokens: 95, leaseEnd: epoch.Add(time.Second)}}, 5, 6, 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			seed(t, c.m, tt.others)
			if s := share1(t, l, shareReq("me", tt.demand, tt.current)); s.Tokens != tt.want {
				t.Fatalf("Tokens %d, want %d", s.Tokens, tt.want)
			}
		})
	}
}

// TestShareCap: a second member gets only what the first leaves, nothing
// while the first holds the whole limit, and its share once the first has
// reported holding a smaller one.
func TestShareCap(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	a := share1(t, l, shareReq("a", -1, 0))
	if a.Tokens != 100 || a.Lookahead != 0 {
		t.Fatalf("a alone: %+v, want the whole limit and nothing leased by others", a)
	}
	c.add(time.Second)
	b := share1(t, l, shareReq("b", -1, 0))
	if b.Tokens != 0 || b.MaxTokens != 0 {
		t.Fatalf("b while a holds all: %+v, want nothing", b)
	}
	c.add(time.Second)
	if a = share1(t, l, shareReq("a", -1, a.Tokens)); a.Tokens != 50 {
		t.Fatalf("a's second report: %+v, want half", a)
	}
	c.add(time.Second)
	if b = share1(t, l, shareReq("b", -1, b.Tokens)); b.Tokens != 0 {
		t.Fatalf("b's second report: %+v, want nothing while a may still hold all (its answer on the way)", b)
	}
	c.add(time.Second)
	if a = share1(t, l, shareReq("a", -1, a.Tokens)); a.Tokens != 50 {
		t.Fatalf("a's third report, holding half: %+v, want half", a)
	}
	c.add(time.Second)
	if b = share1(t, l, shareReq("b", -1, b.Tokens)); b.Tokens != 50 {
		t.Fatalf("b's third report: %+v, want the half a left", b)
	}
	if r := registry(t, c.m); r["a"].tokens+r["b"].tokens != 100 {
		t.Fatalf("registry %+v, want 100 units held in all", r)
	}
}

// TestShareExpiry: a member that stops reporting counts until its lease
// ends, then is dropped and its share goes to the others.
func TestShareExpiry(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	share1(t, l, shareReq("a", 50, 0))
	share1(t, l, shareReq("b", 50, 0))
	c.add(10*time.Second - time.Millisecond) // b's lease ends in 1 ms
	if a := share1(t, l, shareReq("a", 100, 50)); a.Tokens != 50 {
		t.Fatalf("a while b's lease runs: %+v, want 50", a)
	}
	c.add(time.Millisecond) // b's lease ends now
	if a := share1(t, l, shareReq("a", 100, 50)); a.Tokens != 100 || a.Lookahead != 0 {
		t.Fatalf("a once b's lease ended: %+v, want the whole limit and no lookahead", a)
	}
	if _, ok := registry(t, c.m)["b"]; ok {
		t.Fatal("b's ended shareEntry is still in the registry")
	}
}

// TestShareMaxTokens: M = max(1, ceil(T * min(R, W) / W)).
func TestShareMaxTokens(t *testing.T) {
	for _, tt := range []struct {
		limit                uint64
		window, interval     time.Duration
		wantTokens, wantSize uint64
	}{
		{100, time.Minute, 5 * time.Second, 100, 9}, // 8.33 rounded up
		{600, time.Minute, 5 * time.Second, 600, 50},
		{12, time.Minute, 5 * time.Second, 12, 1},
		{1, time.Minute, 5 * time.Second, 1, 1}, // 0.08: at least 1
		{7, time.Second, 5 * time.Second, 7, 7}, // R > W: one window of refill
		{7, 2 * time.Second, time.Second, 7, 4},
	} {
		t.Run(fmt.Sprintf("T=%d,W=%v,R=%v", tt.limit, tt.window, tt.interval), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			r := shareReq("me", -1, 0)
			r.Limit, r.Window, r.ReportInterval = tt.limit, tt.window, tt.interval
			s := share1(t, l, r)
			if s.Tokens != tt.wantTokens || s.MaxTokens != tt.wantSize {
				t.Fatalf("%+v, want T %d, M %d", s, tt.wantTokens, tt.wantSize)
			}
			if e := registry(t, c.m)["me"]; e.size != tt.wantSize {
				t.Fatalf("shareEntry %+v, want M %d stored", e, tt.wantSize)
			}
		})
	}
}

// TestShareLookahead: the units the other live members' buckets may still
// refill, ceil(sum of T * (lease end - now) / W) (their M is not leased); the member's own old
// shareEntry and ended leases count for nothing.
func TestShareLookahead(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	seed(t, c.m, map[string]shareEntry{
		"x":    {demand: 60, tokens: 60, size: 5, leaseEnd: epoch.Add(10 * time.Second)},        // 60 * 10/60 = 10
		"y":    {demand: 30, tokens: 30, size: 3, leaseEnd: epoch.Add(4500 * time.Millisecond)}, // 30 * 4.5/60 = 2.25
		"z":    {demand: 1, tokens: 0, size: 0, leaseEnd: epoch.Add(time.Minute)},               // holds nothing
		"gone": {demand: 50, tokens: 50, size: 5, leaseEnd: epoch},
		"me":   {demand: 10, tokens: 10, size: 1, leaseEnd: epoch.Add(5 * time.Second)},
	})
	s := share1(t, l, shareReq("me", 10, 10))
	if want := uint64(13); s.Lookahead != want {
		t.Fatalf("Lookahead %d, want %d (ceil(12.25))", s.Lookahead, want)
	}
	if s.Tokens != 10 {
		t.Fatalf("Tokens %d, want the 10 the others leave", s.Tokens)
	}
}

// TestShareExpiresTheRegistry: the registry lives 2 * Lease after a report,
// or until the latest lease in it ends when that is later.
func TestShareExpiresTheRegistry(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	share1(t, l, shareReq("a", 10, 0))
	if ttl := c.m.TTL(shareKey); ttl != 20*time.Second {
		t.Fatalf("TTL %v, want 2 * the lease", ttl)
	}
	long := shareReq("b", 10, 0)
	long.Lease = 30 * time.Second
	share1(t, l, long)
	share1(t, l, shareReq("a", 10, 10))
	if ttl := c.m.TTL(shareKey); ttl != 30*time.Second {
		t.Fatalf("TTL %v, want b's lease", ttl)
	}
	if e := registry(t, c.m)["a"]; e.formattedDemand != "10" {
		t.Fatalf("a's demand stored as %q, want 10", e.formattedDemand)
	}
}

// TestShareSumNeverPassesTheLimit: whatever the order of the calls, their
// demands and the clock, and with answers lost on the way (the Envoy then
// holds its old T, and says so next time), the T the Envoys hold under live
// entries never sum past the limit; an entry keeps the larger of its old T
// and its new share.
func TestShareSumNeverPassesTheLimit(t *testing.T) {
	for _, limit := range []uint64{1, 7, 100, 600} {
		t.Run(strconv.FormatUint(limit, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(limit, 25))
			l, c := newTestLimiter(t, epoch)
			held := map[string]uint64{} // what each Envoy holds
			for i := range 500 {
				c.add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				member := fmt.Sprintf("m%d", rng.IntN(8))
				demand := rng.Float64() * 2 * float64(limit)
				if rng.IntN(5) == 0 {
					demand = -1
				}
				current := held[member]
				r := shareReq(member, demand, current)
				r.Limit = limit
				s := share1(t, l, r)
				if rng.IntN(10) != 0 { // else the answer is lost
					held[member] = s.Tokens
				}
				var sum uint64
				entries := registry(t, c.m)
				for name := range held {
					if e, ok := entries[name]; !ok || !e.leaseEnd.After(c.now) {
						held[name] = 0 // its assignment expired in Envoy too
						continue
					}
					sum += held[name]
				}
				if e := entries[member]; e.tokens != max(s.Tokens, current) || e.size != s.MaxTokens {
					t.Fatalf("call %d: stored %+v, answered %+v for a current of %d", i, e, s, current)
				}
				if sum > limit {
					t.Fatalf("call %d (%+v -> %+v): the Envoys hold %d, over the limit %d", i, r, s, sum, limit)
				}
			}
		})
	}
}

func TestShareLimitZero(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	r := shareReq("me", 10, 0)
	r.Limit = 0
	if s := share1(t, l, r); s != (Share{}) {
		t.Fatalf("%+v, want nothing", s)
	}
	if c.m.Exists(shareKey) {
		t.Fatal("a limit of 0 wrote the registry")
	}
}

func TestShareErrors(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	for _, tt := range []struct {
		name string
		edit func(*ShareRequest)
	}{
		{"empty key", func(r *ShareRequest) { r.Key = "" }},
		{"empty member", func(r *ShareRequest) { r.Member = "" }},
		{"no window", func(r *ShareRequest) { r.Window = 0 }},
		{"a window of a fraction of a second", func(r *ShareRequest) { r.Window = 1500 * time.Millisecond }},
		{"a lease under a second", func(r *ShareRequest) { r.Lease = 999 * time.Millisecond }},
		{"no report interval", func(r *ShareRequest) { r.ReportInterval = 0 }},
	} {
		r := shareReq("me", 10, 0)
		tt.edit(&r)
		if _, err := Assign(context.Background(), l, r); err == nil || errors.Is(err, limiter.ErrStore) {
			t.Errorf("%s: %v, want a non-store error", tt.name, err)
		}
	}
	if c.m.Exists(shareKey) {
		t.Fatal("a bad request wrote the registry")
	}
	c.m.HSet(shareKey, "other", "not an shareEntry")
	if _, err := Assign(context.Background(), l, shareReq("me", 10, 0)); !errors.Is(err, limiter.ErrStore) {
		t.Fatalf("a corrupt shareEntry: %v, want limiter.ErrStore", err)
	}
	c.m.Close()
	if _, err := Assign(context.Background(), l, shareReq("me", 10, 0)); !errors.Is(err, limiter.ErrStore) {
		t.Fatalf("store down: %v, want limiter.ErrStore", err)
	}
	l.Close()
	if _, err := Assign(context.Background(), l, shareReq("me", 10, 0)); !errors.Is(err, limiter.ErrClosed) {
		t.Fatalf("closed: %v, want limiter.ErrClosed", err)
	}
}

func TestShareIsObserved(t *testing.T) {
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	var observed []error
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1, Observe: func(_ time.Duration, err error) { observed = append(observed, err) }})
	defer l.Close()
	share1(t, l, shareReq("me", 10, 0))
	if len(observed) != 1 || observed[0] != nil {
		t.Fatalf("observed %v, want one successful store call", observed)
	}
}

// TestConfirmShare: a member sent a smaller share has its entry lowered to
// it, so that the others get what it gave up at once; a confirmation never
// raises an entry, and one for an expired entry changes nothing.
func TestConfirmShare(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	ctx := context.Background()
	share1(t, l, shareReq("a", -1, 0)) // a holds all 100
	if a := share1(t, l, shareReq("a", 40, 100)); a.Tokens != 40 || registry(t, c.m)["a"].tokens != 100 {
		t.Fatalf("a's smaller share %+v, entry %+v: want 40 granted and 100 kept until sent", a, registry(t, c.m)["a"])
	}
	if b := share1(t, l, shareReq("b", 60, 0)); b.Tokens != 0 {
		t.Fatalf("b before a's share was sent: %+v, want nothing", b)
	}
	if err := Confirm(ctx, l, shareKey, "a", time.Minute, 40); err != nil {
		t.Fatal(err)
	}
	if b := share1(t, l, shareReq("b", 60, 0)); b.Tokens != 60 {
		t.Fatalf("b once a's share was sent: %+v, want the 60 a gave up", b)
	}
	if err := Confirm(ctx, l, shareKey, "a", time.Minute, 90); err != nil || registry(t, c.m)["a"].tokens != 40 {
		t.Fatalf("a confirmation above the entry: %v, entry %+v; want it left at 40", err, registry(t, c.m)["a"])
	}
	if err := Confirm(ctx, l, shareKey, "gone", time.Minute, 1); err != nil {
		t.Fatalf("a confirmation for no entry: %v", err)
	}
	if _, ok := registry(t, c.m)["gone"]; ok {
		t.Fatal("a confirmation made an entry")
	}
}
