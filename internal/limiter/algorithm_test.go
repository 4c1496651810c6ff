package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	glua "github.com/yuin/gopher-lua"

	"github.com/slidingwindow/ratelimit/internal/algorithm"
	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// describeT is describe for an algorithm the test knows.
func describeT(t *testing.T, a config.Algorithm) *algorithm.Descriptor {
	t.Helper()
	d, err := describe(a)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestAlgorithmsAreDescribed: every algorithm config knows has a
// description, under its own name, and the tests' list is all of them.
func TestAlgorithmsAreDescribed(t *testing.T) {
	if got := config.Algorithms(); !slices.Equal(got, append(slices.Clip(algorithms), config.ReferenceFixedWindow)) {
		t.Fatalf("config.Algorithms() = %v, want the tests' list %v", got, algorithms)
	}
	keys := map[string]bool{}
	for _, a := range config.Algorithms() {
		d := describeT(t, a)
		if d.Name != a.String() || d.ID != int(a) {
			t.Errorf("%v is described as %d %q", a, d.ID, d.Name)
		}
		if keys[d.Key] || d.Key == "" || strings.ContainsAny(d.Key, "|=*{}:") {
			t.Errorf("%v: key code %q is empty, taken or holds a separator", a, d.Key)
		}
		keys[d.Key] = true
	}
}

// TestUnknownAlgorithmIsAnError: no algorithm stands in for one the Lua does
// not implement: Decide and Reset refuse its hits, sending nothing.
func TestUnknownAlgorithmIsAnError(t *testing.T) {
	for _, a := range []config.Algorithm{0, config.Algorithm(len(config.Algorithms()) + 1), 255} {
		t.Run(strconv.Itoa(int(a)), func(t *testing.T) {
			if _, err := describe(a); !errors.Is(err, errUnknownAlgorithm) {
				t.Fatalf("describe(%d) = %v, want errUnknownAlgorithm", a, err)
			}
			h := hit(a, "k", 10, time.Minute, 1)
			if _, err := hitArg(&h, &requestRule{}, epoch); !errors.Is(err, errUnknownAlgorithm) {
				t.Fatalf("hitArg: %v, want errUnknownAlgorithm", err)
			}
			if _, err := refundArgs(nil, &h, 0); !errors.Is(err, errUnknownAlgorithm) {
				t.Fatalf("refundArgs: %v, want errUnknownAlgorithm", err)
			}
			for _, known := range config.Algorithms() {
				if strings.HasSuffix(h.Key, ":"+describeT(t, known).Key+":60") {
					t.Fatalf("key %q is %v's", h.Key, known)
				}
			}

			l, c := newTestLimiter(t, epoch)
			before := c.m.CommandCount()
			h.FailureMode = config.FailureDeny
			ok := hit(config.FixedWindow, "ok", 10, time.Minute, 1)
			v, err := l.Decide(context.Background(), []Hit{ok, h})
			if !errors.Is(err, errUnknownAlgorithm) || errors.Is(err, ErrStore) {
				t.Fatalf("Decide: %v, want errUnknownAlgorithm and not a store error", err)
			}
			if !v[0].FailureVerdict || !v[0].Admitted || v[0].Charged || !v[1].FailureVerdict || v[1].Admitted {
				t.Fatalf("verdicts %+v, want each by its failure mode, nothing charged", v)
			}
			if _, err := l.Reset(context.Background(), h); !errors.Is(err, errUnknownAlgorithm) {
				t.Fatalf("Reset: %v, want errUnknownAlgorithm", err)
			}
			if n := c.m.CommandCount() - before; n != 0 {
				t.Fatalf("%d store commands for a request with an unknown algorithm, want none", n)
			}
		})
	}
}

// TestHitArgs: what each kind of hit sends decide.lua.
func TestHitArgs(t *testing.T) {
	big := uint64(1) << 60
	quotas := &requestRule{}                                            // none over
	over3 := &requestRule{quotas: []quotaTally{{group: 3, over: true}}} // group 3's over before the store
	for _, tt := range []struct {
		name   string
		h      Hit
		quotas *requestRule
		want   string
	}{
		{"log", Hit{Algorithm: config.SlidingWindowLog, Limit: 5, Window: time.Minute, Cost: 2}, quotas, "1:ce:5:60:2"},
		{"counter shadow", Hit{Algorithm: config.SlidingWindowCounter, Limit: 5, Window: time.Second, Cost: 1, Shadow: true}, quotas, "2:cs:5:1:1"},
		{"fixed record", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 9, Record: true}, quotas, "3:re:5:3600:9"},
		{"fixed record if alone", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 9, Record: true, RecordIfAlone: true}, quotas, "3:ae:5:3600:9"},
		{"fixed refund", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 3, Refund: true}, quotas, "3:fe:5:3600:3"},
		{"quota", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true}, quotas, "3:cq0:5:3600:1"},
		{"quota as shadow", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true}, nil, "3:cs:5:3600:1"},
		{"shadow quota", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true, Shadow: true}, quotas, "3:cs:5:3600:1"},
		{"quota group 3", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true, QuotaGroup: 3}, quotas, "3:cq3:5:3600:1"},
		{"quota group 3 over", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true, QuotaGroup: 3}, over3, "3:co3:5:3600:1"},
		{"quota group 2, 3 over", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true, QuotaGroup: 2}, over3, "3:cq2:5:3600:1"},
		{"quota group 3 as shadow", Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 1, Quota: true, QuotaGroup: 3}, nil, "3:cs:5:3600:1"},
		{"gcra burst", Hit{Algorithm: config.GCRA, Limit: 5, Window: time.Minute, Cost: 1, Burst: 7}, quotas, "4:ce:5:60:1:7"},
		{"gcra no burst", Hit{Algorithm: config.GCRA, Limit: 5, Window: time.Minute, Cost: 1}, quotas, "4:ce:5:60:1:5"},
		{"log cost capped", Hit{Algorithm: config.SlidingWindowLog, Limit: 5, Window: time.Minute, Cost: big}, quotas, "1:ce:5:60:9007199254740992"},
		{"gcra cost capped", Hit{Algorithm: config.GCRA, Limit: 5, Window: time.Minute, Cost: big}, quotas, "4:ce:5:60:4294967296:5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := hitArg(&tt.h, tt.quotas, epoch)
			if err != nil || got != tt.want {
				t.Fatalf("hitArg = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestHitCodesDecodeInLua: what hitArg sends, decide.lua reads back as the
// hit it came from: the algorithm (by its Lua table), its operation (one
// kind per hit: a refund is no record) and role, the limit, window, cost
// and burst, a quota hit's group and whether its quota is over already.
// decide.lua's parse_rule runs in a plain Lua state.
func TestHitCodesDecodeInLua(t *testing.T) {
	const call = "return decide(KEYS, ARGV)\n"
	if !strings.HasSuffix(lua.Decide(), call) {
		t.Fatalf("lua.Decide() does not end with %q", call)
	}
	var byName strings.Builder
	for _, d := range algorithm.All() {
		fmt.Fprintf(&byName, "[%q] = %s, ", d.Name, d.Name)
	}
	L := glua.NewState()
	defer L.Close()
	err := L.DoString(strings.TrimSuffix(lua.Decide(), call) + `
local by_name = { ` + byName.String() + ` }
return function(s)
  local r = parse_rule(s)
  local name = '?'
  for n, t in pairs(by_name) do
    if t == r.alg then
      name = n
    end
  end
  return name, r.shadow, r.record, r.refund, r.quota, r.limit, r.window, r.cost, r.burst, r.group, r.over, r.conditional ~= false
end, function() record_conditions.record_if_alone = nil end`)
	if err != nil {
		t.Fatal(err)
	}
	parse, dropCondition := L.Get(-2), L.Get(-1)
	L.Pop(2)
	for _, a := range config.Algorithms() {
		for flags := range 256 {
			h := Hit{Algorithm: a, Limit: 7, Window: 3 * time.Minute, Cost: 5, Burst: 9,
				Shadow: flags&1 != 0, Record: flags&2 != 0, Refund: flags&4 != 0, Quota: flags&8 != 0, RecordIfAlone: flags&128 != 0}
			if flags&32 != 0 {
				h.QuotaGroup = math.MaxUint32
			}
			var quotas *requestRule
			if flags&16 != 0 {
				quotas = &requestRule{quotas: []quotaTally{{group: math.MaxUint32, over: flags&64 != 0}}}
			}
			arg, err := hitArg(&h, quotas, epoch)
			if err != nil {
				t.Fatal(err)
			}
			if err := L.CallByParam(glua.P{Fn: parse, NRet: 12, Protect: true}, glua.LString(arg)); err != nil {
				t.Fatalf("%s: %v", arg, err)
			}
			got := make([]string, 12)
			for i := range got {
				got[i] = L.Get(i - 12).String()
			}
			L.Pop(12)
			burst := "nil"
			if describeT(t, a).Bucket {
				burst = "9"
			}
			quota := h.quota() && quotas != nil
			group := uint32(0)
			if quota {
				group = h.QuotaGroup
			}
			op := h.op()
			want := []string{a.String(), fmt.Sprint(h.Shadow || h.quota() && !quota), fmt.Sprint(op.Record), fmt.Sprint(op.AppliedFirst),
				fmt.Sprint(quota), "7", "180000000", "5", burst, fmt.Sprint(group), fmt.Sprint(quota && quotas.quotaOver(h.QuotaGroup)),
				fmt.Sprint(op.Conditional)}
			if !slices.Equal(got, want) {
				t.Errorf("%+v (quotas %+v) sent as %q reads back as %q, want %q", h, quotas, arg, got, want)
			}
		}
	}
	// A conditional op whose condition no file names is refused, not
	// decided as a plain record.
	if err := L.CallByParam(glua.P{Fn: dropCondition, Protect: true}); err != nil {
		t.Fatal(err)
	}
	arg, err := hitArg(&Hit{Algorithm: config.FixedWindow, Limit: 5, Window: time.Hour, Cost: 9, Record: true, RecordIfAlone: true}, nil, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := L.CallByParam(glua.P{Fn: parse, NRet: 12, Protect: true}, glua.LString(arg)); err == nil || !strings.Contains(err.Error(), "no condition") {
		t.Errorf("%s without its condition: %v, want refused", arg, err)
	}
}
