package config

import (
	"testing"
	"time"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	zone, err := loadZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return zone
}

func TestCalendarEdges(t *testing.T) {
	berlin, newYork := mustZone(t, "Europe/Berlin"), mustZone(t, "America/New_York")
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tt := range []struct {
		name string
		c    Calendar
		now  string
		want [4]string // RFC 3339, in UTC
	}{
		{"month", Calendar{Months: 1}, "2026-03-15T12:00:00Z",
			[4]string{"2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"}},
		{"month, its first instant", Calendar{Months: 1}, "2026-03-01T00:00:00Z",
			[4]string{"2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"}},
		{"month, its last instant", Calendar{Months: 1}, "2026-02-28T23:59:59.999999999Z",
			[4]string{"2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"}},
		{"December to January", Calendar{Months: 1}, "2026-12-31T23:59:59Z",
			[4]string{"2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z"}},
		{"January, from December", Calendar{Months: 1}, "2027-01-01T00:00:00Z",
			[4]string{"2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"}},
		// 29 days: the window after it starts on 1 March.
		{"leap February", Calendar{Months: 1}, "2028-02-29T23:00:00Z",
			[4]string{"2028-01-01T00:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", "2028-04-01T00:00:00Z"}},
		// Berlin is UTC+1 in winter, +2 in summer: its March starts at 23:00 UTC on
		// 28 February, its April at 22:00 UTC on 31 March (DST began on 29 March).
		{"month in Berlin", Calendar{Months: 1, Zone: berlin}, "2026-03-31T21:59:59Z",
			[4]string{"2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z"}},
		{"month in Berlin, already April there", Calendar{Months: 1, Zone: berlin}, "2026-03-31T22:00:00Z",
			[4]string{"2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z", "2026-05-31T22:00:00Z"}},
		{"quarter", Calendar{Months: 3}, "2026-05-20T00:00:00Z",
			[4]string{"2026-01-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z", "2026-10-01T00:00:00Z"}},
		{"year", Calendar{Months: 12}, "2026-05-20T00:00:00Z",
			[4]string{"2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"}},
		{"year in New York", Calendar{Months: 12, Zone: newYork}, "2027-01-01T04:59:59Z",
			[4]string{"2025-01-01T05:00:00Z", "2026-01-01T05:00:00Z", "2027-01-01T05:00:00Z", "2028-01-01T05:00:00Z"}},
		// 2026-11-26 is a Thursday: its week started on Monday 23 November.
		{"week", Calendar{Days: 7}, "2026-11-26T10:00:00Z",
			[4]string{"2026-11-16T00:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"}},
		{"week, Sunday night", Calendar{Days: 7}, "2026-11-29T23:59:59Z",
			[4]string{"2026-11-16T00:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"}},
		{"week over the new year", Calendar{Days: 7}, "2027-01-01T00:00:00Z",
			[4]string{"2026-12-21T00:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", "2027-01-11T00:00:00Z"}},
		// Berlin's clocks went back on Sunday 25 October 2026: that week lasted
		// 169 hours, from 22:00 UTC to 23:00 UTC.
		{"week with a DST change in Berlin", Calendar{Days: 7, Zone: berlin}, "2026-10-22T12:00:00Z",
			[4]string{"2026-10-11T22:00:00Z", "2026-10-18T22:00:00Z", "2026-10-25T23:00:00Z", "2026-11-01T23:00:00Z"}},
		// New York's clocks went forward on Sunday 8 March 2026: 167 hours.
		{"week with a DST change in New York", Calendar{Days: 7, Zone: newYork}, "2026-03-08T12:00:00Z",
			[4]string{"2026-02-23T05:00:00Z", "2026-03-02T05:00:00Z", "2026-03-09T04:00:00Z", "2026-03-16T04:00:00Z"}},
		// Fortnights count from Monday 5 January 1970: 1484 of them to 23 November 2026.
		{"two weeks", Calendar{Days: 14}, "2026-11-26T10:00:00Z",
			[4]string{"2026-11-09T00:00:00Z", "2026-11-23T00:00:00Z", "2026-12-07T00:00:00Z", "2026-12-21T00:00:00Z"}},
		// A day of 23 hours.
		{"day in Berlin, DST begins", Calendar{Days: 1, Zone: berlin}, "2026-03-29T12:00:00Z",
			[4]string{"2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", "2026-03-30T22:00:00Z"}},
		{"before 1970", Calendar{Months: 1}, "1969-12-15T00:00:00Z",
			[4]string{"1969-11-01T00:00:00Z", "1969-12-01T00:00:00Z", "1970-01-01T00:00:00Z", "1970-02-01T00:00:00Z"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := utc(tt.now)
			got := tt.c.Edges(now)
			for i, w := range tt.want {
				if !got[i].Equal(utc(w)) {
					t.Errorf("edge %d = %v, want %s", i, got[i].UTC(), w)
				}
			}
			if now.Before(got[1]) || !now.Before(got[2]) {
				t.Errorf("now %v is not in the window [%v, %v)", now, got[1].UTC(), got[2].UTC())
			}
		})
	}
}

func TestCalendarOf(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for _, tt := range []struct {
		a          Algorithm
		u          Unit
		multiplier uint32
		zone       *time.Location
		want       Calendar
	}{
		{FixedWindow, Month, 1, nil, Calendar{Months: 1}},
		{FixedWindow, Year, 2, berlin, Calendar{Months: 24, Zone: berlin}},
		{FixedWindow, Week, 1, nil, Calendar{Days: 7}},
		{FixedWindow, Day, 3, berlin, Calendar{Days: 3, Zone: berlin}},
		{FixedWindow, Day, 1, nil, Calendar{}}, // the epoch's days are UTC's
		{FixedWindow, Hour, 1, nil, Calendar{}},
		{SlidingWindowCounter, Month, 1, nil, Calendar{}},
		{SlidingWindowLog, Week, 1, nil, Calendar{}},
		{GCRA, Month, 1, nil, Calendar{}},
		{ReferenceFixedWindow, Month, 1, nil, Calendar{}},
	} {
		if got := CalendarOf(tt.a, tt.u, tt.multiplier, tt.zone); got != tt.want {
			t.Errorf("CalendarOf(%v, %v, %d, %v) = %v, want %v", tt.a, tt.u, tt.multiplier, tt.zone, got, tt.want)
		}
	}
}

func TestLoadZoneOnePointerPerName(t *testing.T) {
	a, b := mustZone(t, "Europe/Berlin"), mustZone(t, "Europe/Berlin")
	if a != b {
		t.Error("two loads of Europe/Berlin gave two Locations: Calendars of one rule would differ")
	}
	if utc := mustZone(t, "UTC"); utc != nil {
		t.Errorf("UTC loaded as %v, want nil (the default)", utc)
	}
}
