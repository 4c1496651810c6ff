package config

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	// Time zones are compiled in: a rule's time_zone loads the same on a
	// distroless image without /usr/share/zoneinfo as on a laptop.
	_ "time/tzdata"
)

// Calendar describes fixed windows aligned to the calendar of a time zone:
// Days > 0 for windows of whole days (a week starts on Monday, as ISO 8601
// counts), Months > 0 for windows of whole months (a year starts in
// January). The zero value is no calendar: windows of a fixed length,
// aligned to the Unix epoch. Comparable, so that a hit's rule can be
// compared whole.
type Calendar struct {
	Days, Months int
	// Zone is the time zone whose midnights the windows start at; nil is
	// UTC.
	Zone *time.Location
}

// CalendarOf returns the calendar of windows of multiplier units in zone
// (nil: UTC) for algorithm a. Only fixed_window aligns to the calendar: a
// sliding window or a bucket has no edge to align, and the reference's
// keys name epoch-aligned windows (see docs/migration.md). Its weeks,
// months and years always do; a day does when a zone is named, since a UTC
// day is already an epoch-aligned window.
func CalendarOf(a Algorithm, u Unit, multiplier uint32, zone *time.Location) Calendar {
	if a != FixedWindow {
		return Calendar{}
	}
	n := int(max(multiplier, 1))
	switch u {
	case Day:
		if zone != nil {
			return Calendar{Days: n, Zone: zone}
		}
	case Week:
		return Calendar{Days: 7 * n, Zone: zone}
	case Month:
		return Calendar{Months: n, Zone: zone}
	case Year:
		return Calendar{Months: 12 * n, Zone: zone}
	}
	return Calendar{}
}

// IsZero reports no calendar.
func (c Calendar) IsZero() bool { return c.Days == 0 && c.Months == 0 }

// monday is the civil day number (days since 1970-01-01) of a Monday, the
// origin of windows of weeks: 1970-01-05.
const monday = 4

// Edges returns the starts of the window before the one holding now, of
// that window, of the next and of the one after: three windows, for the
// store to pick the one holding its own clock. The Go side computes them
// because Redis's Lua has no time zones; the store's clock decides, so that
// instances whose clocks differ a little agree on where a count belongs.
func (c Calendar) Edges(now time.Time) [4]time.Time {
	zone := c.zone()
	y, m, d := now.In(zone).Date()
	var edges [4]time.Time
	if c.Months > 0 {
		// Months since January 1970, rounded down to a multiple of the
		// window: 3 months start in January, April, July and October.
		idx := floorDiv((y-1970)*12+int(m)-1, c.Months) * c.Months
		for i := range edges {
			edges[i] = time.Date(1970, time.Month(1+idx+(i-1)*c.Months), 1, 0, 0, 0, 0, zone)
		}
		return edges
	}
	// Days since 1970-01-01 by the zone's date (the date alone, computed in
	// UTC: a zone's day may last 23 or 25 hours), rounded down to a
	// multiple of the window from the origin.
	day := int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400)
	origin := 0
	if c.Days%7 == 0 {
		origin = monday
	}
	idx := origin + floorDiv(day-origin, c.Days)*c.Days
	for i := range edges {
		edges[i] = time.Date(1970, 1, 1+idx+(i-1)*c.Days, 0, 0, 0, 0, zone)
	}
	return edges
}

// String names the calendar in store keys and logs: "1mo", "12mo", "7d",
// and "@" and the zone's name when it has one, e.g. "1mo@Europe/Berlin".
func (c Calendar) String() string {
	if c.IsZero() {
		return "none"
	}
	s := strconv.Itoa(c.Days) + "d"
	if c.Months > 0 {
		s = strconv.Itoa(c.Months) + "mo"
	}
	if c.Zone != nil {
		s += "@" + c.Zone.String()
	}
	return s
}

func (c Calendar) zone() *time.Location {
	if c.Zone == nil {
		return time.UTC
	}
	return c.Zone
}

func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// loadZone reads rate_limit.time_zone: an IANA name such as Europe/Berlin.
// UTC is nil, the default, so that naming it changes no counter.
func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		// "" is UTC to time.LoadLocation, and Local the host's zone: a
		// config must mean one thing on every host.
		return nil, fmt.Errorf("time_zone %q: want an IANA time zone name, such as Europe/Berlin or UTC", name)
	}
	if zone, ok := zones.Load(name); ok {
		return zone.(*time.Location), nil
	}
	zone, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time_zone %q: %w", name, err)
	}
	if zone == time.UTC {
		zone = nil
	}
	actual, _ := zones.LoadOrStore(name, zone)
	return actual.(*time.Location), nil
}

// zones holds each zone loaded, by name: time.LoadLocation makes a new
// Location each time, and a Calendar is compared whole, so one name must
// give one pointer, across reloads too. The IANA database bounds it.
var zones sync.Map
