package limiter

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// calendarLimiter is a limiter whose Go clock (the edges it sends) is goNow,
// on a miniredis whose TIME is redisNow: each is frozen, and moved apart to
// test skew.
type calendarLimiter struct {
	l        *Limiter
	m        *miniredis.Miniredis
	goNow    time.Time
	redisNow time.Time
}

func newCalendarLimiter(t *testing.T) *calendarLimiter {
	t.Helper()
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	c := &calendarLimiter{m: m}
	c.l = New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1, Now: func() time.Time { return c.goNow }})
	t.Cleanup(c.l.Close)
	return c
}

// at sets both clocks to now, Redis's skew later.
func (c *calendarLimiter) at(now time.Time, skew time.Duration) {
	c.goNow, c.redisNow = now, now.Add(skew)
	c.m.SetTime(c.redisNow)
}

func calendarHit(cal config.Calendar, unit config.Unit, limit uint32, cost uint64) Hit {
	var b KeyBuilder
	b.Reset("test")
	b.Add("user", "alice")
	return Hit{Key: b.CalendarKey(config.FixedWindow, cal), Algorithm: config.FixedWindow, Limit: limit,
		Window: unit.Duration(), Calendar: cal, Cost: cost, FailureMode: config.FailureDeny}
}

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	z, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func utcTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCalendarWindows: a budget spent just before a calendar edge is whole
// again at the edge, by Redis TIME, and answers the time to that edge as
// its reset; its key lives until the edge. Go's clock, which computes the
// edges, may be off Redis's by seconds either way.
func TestCalendarWindows(t *testing.T) {
	monthly := config.Calendar{Months: 1}
	for _, tt := range []struct {
		name  string
		cal   config.Calendar
		unit  config.Unit
		spend string        // Redis TIME of the spending, RFC 3339
		skew  time.Duration // Redis TIME - Go's clock, both frozen
		edge  string        // the window's end, where the budget is whole again
		next  time.Duration // the next window's length
	}{
		{"month", monthly, config.Month, "2026-03-31T23:59:58Z", 0, "2026-04-01T00:00:00Z", 30 * 24 * time.Hour},
		{"December to January", monthly, config.Month, "2026-12-31T23:59:59.5Z", 0, "2027-01-01T00:00:00Z", 31 * 24 * time.Hour},
		{"into a leap February", monthly, config.Month, "2028-01-31T23:59:59Z", 0, "2028-02-01T00:00:00Z", 29 * 24 * time.Hour},
		{"out of a leap February", monthly, config.Month, "2028-02-29T23:59:59Z", 0, "2028-03-01T00:00:00Z", 31 * 24 * time.Hour},
		// Go's clock already in April, Redis's still in March: March's count.
		{"Go's clock ahead", monthly, config.Month, "2026-03-31T23:59:58Z", -3 * time.Second, "2026-04-01T00:00:00Z", 30 * 24 * time.Hour},
		// Go's clock still in March when Redis's is at its last second.
		{"Go's clock behind", monthly, config.Month, "2026-03-31T23:59:59Z", 5 * time.Second, "2026-04-01T00:00:00Z", 30 * 24 * time.Hour},
		// Berlin's March ends at 22:00 UTC (CEST, UTC+2, since 29 March).
		{"month in Berlin", config.Calendar{Months: 1, Zone: zone(t, "Europe/Berlin")}, config.Month,
			"2026-03-31T21:59:59Z", 0, "2026-03-31T22:00:00Z", 30 * 24 * time.Hour},
		// Berlin's clocks go back on Sunday 25 October 2026: the week from
		// Monday 26 October is 168 hours again, the week before 169.
		{"week in Berlin over a DST change", config.Calendar{Days: 7, Zone: zone(t, "Europe/Berlin")}, config.Week,
			"2026-10-25T22:59:59Z", 0, "2026-10-25T23:00:00Z", 7 * 24 * time.Hour},
		// New York's clocks go forward on Sunday 8 March 2026: that week
		// (from Monday 2 March, 05:00 UTC) ends at 04:00 UTC, 167 hours on.
		{"week in New York over a DST change", config.Calendar{Days: 7, Zone: zone(t, "America/New_York")}, config.Week,
			"2026-03-09T03:59:59Z", 0, "2026-03-09T04:00:00Z", 7 * 24 * time.Hour},
		// Monday 30 November 2026, 00:00 UTC: a week starts.
		{"week", config.Calendar{Days: 7}, config.Week, "2026-11-29T23:59:59Z", 0, "2026-11-30T00:00:00Z", 7 * 24 * time.Hour},
		// A quarter ends with June.
		{"quarter", config.Calendar{Months: 3}, config.Month, "2026-06-30T23:59:59Z", 0, "2026-07-01T00:00:00Z", 92 * 24 * time.Hour},
		{"year", config.Calendar{Months: 12}, config.Year, "2026-12-31T23:59:59Z", 0, "2027-01-01T00:00:00Z", 365 * 24 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCalendarLimiter(t)
			spend, edge := utcTime(t, tt.spend), utcTime(t, tt.edge)
			c.at(spend.Add(-tt.skew), tt.skew)
			h := calendarHit(tt.cal, tt.unit, 1000, 1000)
			if v := decide1(t, c.l, h); !v.Admitted || !v.Charged || v.Remaining != 0 || v.ResetAfter != edge.Sub(spend) {
				t.Fatalf("spending the budget: %+v, want admitted, 0 remaining, reset after %v", v, edge.Sub(spend))
			}
			h.Cost = 1
			if v := decide1(t, c.l, h); v.Admitted || v.ResetAfter != edge.Sub(spend) {
				t.Fatalf("one more: %+v, want denied until the edge, %v", v, edge.Sub(spend))
			}
			if ttl := c.m.TTL(h.Key); ttl < edge.Sub(spend) || ttl > edge.Sub(spend)+time.Millisecond {
				t.Errorf("the key's TTL %v, want the %v to the edge", ttl, edge.Sub(spend))
			}
			// A microsecond before the edge by Redis's clock: still spent.
			c.at(edge.Add(-time.Microsecond-tt.skew), tt.skew)
			if v := decide1(t, c.l, h); v.Admitted || v.ResetAfter != time.Microsecond {
				t.Fatalf("a microsecond before the edge: %+v, want denied for 1µs", v)
			}
			// At the edge: a whole budget, reset at the end of the next window.
			c.at(edge.Add(-tt.skew), tt.skew)
			if v := decide1(t, c.l, h); !v.Admitted || v.Remaining != 999 || v.ResetAfter != tt.next {
				t.Fatalf("at the edge: %+v, want admitted, 999 remaining, reset after %v", v, tt.next)
			}
		})
	}
}

// TestCalendarCostPastTheLimit: a cost no window of the calendar holds is
// denied without a store call, with the time to the end of the limiter's
// calendar window as its reset, not the unit's nominal length.
func TestCalendarCostPastTheLimit(t *testing.T) {
	c := newCalendarLimiter(t)
	c.at(utcTime(t, "2026-02-27T00:00:00Z"), 0)
	h := calendarHit(config.Calendar{Months: 1}, config.Month, 10, 11)
	if v := decide1(t, c.l, h); v.Admitted || !v.CostExceedsLimit || v.ResetAfter != 2*24*time.Hour {
		t.Fatalf("%+v, want denied, cost past the limit, reset at 1 March (48h)", v)
	}
}

// TestCalendarFarFromGoClock: Redis TIME further off Go's clock than the
// edges sent reach counts in the nearest window sent, never fails, and
// never sets a key without expiry.
func TestCalendarFarFromGoClock(t *testing.T) {
	c := newCalendarLimiter(t)
	h := calendarHit(config.Calendar{Days: 1, Zone: zone(t, "Europe/Berlin")}, config.Day, 10, 1)
	// Go thinks it is 10 May; Redis says 20 May. The edges reach 12 May, 00:00 in Berlin.
	c.at(utcTime(t, "2026-05-10T12:00:00Z"), 10*24*time.Hour)
	if v := decide1(t, c.l, h); !v.Admitted || v.ResetAfter != 0 {
		t.Fatalf("%+v, want admitted, a window already over", v)
	}
	if ttl := c.m.TTL(h.Key); ttl <= 0 || ttl > time.Millisecond {
		t.Errorf("TTL %v, want the least one, 1ms", ttl)
	}
	// Redis says 1 May: the first window sent (9 May, in Berlin) stands, to its end.
	c.m.Del(h.Key)
	c.at(utcTime(t, "2026-05-10T12:00:00Z"), -9*24*time.Hour)
	end := utcTime(t, "2026-05-09T22:00:00Z") // 10 May, 00:00 CEST
	if v := decide1(t, c.l, h); !v.Admitted || v.ResetAfter != end.Sub(c.redisNow) {
		t.Fatalf("%+v, want admitted, reset after %v", v, end.Sub(c.redisNow))
	}
}

// TestCalendarOnlyForFixedWindow: a calendar on any other algorithm is
// refused before anything is sent, as an unknown algorithm is.
func TestCalendarOnlyForFixedWindow(t *testing.T) {
	c := newCalendarLimiter(t)
	c.at(epoch, 0)
	for _, a := range config.Algorithms() {
		if a == config.FixedWindow {
			continue
		}
		h := calendarHit(config.Calendar{Months: 1}, config.Month, 10, 1)
		h.Algorithm = a
		before := c.m.CommandCount()
		if _, err := c.l.Decide(context.Background(), []Hit{h}); !errors.Is(err, errCalendar) {
			t.Errorf("%v: Decide: %v, want errCalendar", a, err)
		}
		if n := c.m.CommandCount() - before; n != 0 {
			t.Errorf("%v: %d store commands, want none", a, n)
		}
	}
}

// TestCalendarKeys: a calendar's counter is named by the calendar, never by
// a length, so it is never read as one of epoch-aligned windows (whose
// value names its window by index, not by start); each zone has its own.
func TestCalendarKeys(t *testing.T) {
	berlin := zone(t, "Europe/Berlin")
	var b KeyBuilder
	for _, tt := range []struct {
		cal  config.Calendar
		want string
	}{
		{config.Calendar{Months: 1}, "rl:{d|k=v}:fixed:1mo"},
		{config.Calendar{Months: 12, Zone: berlin}, "rl:{d|k=v}:fixed:12mo@Europe/Berlin"},
		{config.Calendar{Days: 7}, "rl:{d|k=v}:fixed:7d"},
		{config.Calendar{Days: 1, Zone: zone(t, "Etc/GMT+5")}, "rl:{d|k=v}:fixed:1d@Etc/GMT%2B5"},
	} {
		b.Reset("d")
		b.Add("k", "v")
		if got := b.CalendarKey(config.FixedWindow, tt.cal); got != tt.want {
			t.Errorf("CalendarKey(%v) = %q, want %q", tt.cal, got, tt.want)
		}
	}
}

// TestCalendarHitArg: the edges go as Unix seconds, ascending, around Go's
// clock, in place of the window's length.
func TestCalendarHitArg(t *testing.T) {
	h := calendarHit(config.Calendar{Months: 1}, config.Month, 5, 2)
	got, err := hitArg(&h, &requestRule{}, utcTime(t, "2026-12-15T00:00:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	edges := []string{"2026-11-01", "2026-12-01", "2027-01-01", "2027-02-01"}
	var want strings.Builder
	want.WriteString("3:ce:5:")
	for i, e := range edges {
		if i > 0 {
			want.WriteByte(',')
		}
		want.WriteString(strconv.FormatInt(utcTime(t, e+"T00:00:00Z").Unix(), 10))
	}
	want.WriteString(":2")
	if got != want.String() {
		t.Errorf("hitArg = %q, want %q", got, want.String())
	}
}

// TestCalendarRefund: a refund gives units back to the calendar window
// holding Redis TIME, and refund.lua's undo to the window its charge went
// to, by its token (the window's start).
func TestCalendarRefund(t *testing.T) {
	c := newCalendarLimiter(t)
	c.at(utcTime(t, "2026-07-15T00:00:00Z"), 0)
	h := calendarHit(config.Calendar{Months: 1}, config.Month, 10, 6)
	v := decide1(t, c.l, h)
	if !v.Admitted || v.Remaining != 4 || v.Token != utcTime(t, "2026-07-01T00:00:00Z").Unix() {
		t.Fatalf("%+v, want admitted, 4 remaining, token July's start", v)
	}
	back := h
	back.Cost, back.Refund = 2, true
	if v := decide1(t, c.l, back); !v.Admitted || v.Remaining != 6 {
		t.Fatalf("refund: %+v, want 6 remaining", v)
	}
	if n, err := c.l.GiveBack(context.Background(), []Return{{Hit: h, Token: v.Token, Units: 6}}); err != nil || n != 4 {
		t.Fatalf("GiveBack = %d, %v; want the 4 units the window still counts", n, err)
	}
	h.Cost = 10
	if v := decide1(t, c.l, h); !v.Admitted {
		t.Fatalf("the whole budget after the refunds: %+v, want admitted", v)
	}
}
