package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseAlgorithm(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Algorithm
	}{
		{"sliding_window_log", SlidingWindowLog},
		{"sliding_window_counter", SlidingWindowCounter},
		{"fixed_window", FixedWindow},
		{"gcra", GCRA},
		{"reference_fixed_window", ReferenceFixedWindow},
	} {
		got, err := ParseAlgorithm(tt.in)
		if err != nil || got != tt.want || got.String() != tt.in {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	all := []Algorithm{SlidingWindowLog, SlidingWindowCounter, FixedWindow, GCRA, ReferenceFixedWindow}
	if got := Algorithms(); !slices.Equal(got, all) {
		t.Errorf("Algorithms() = %v, want %v", got, all)
	}
	want := []string{"sliding_window_log", "sliding_window_counter", "fixed_window", "gcra", "reference_fixed_window"}
	if got := AlgorithmNames(); !slices.Equal(got, want) {
		t.Errorf("AlgorithmNames() = %q, want %q", got, want)
	}
	for _, in := range []string{"", "FIXED_WINDOW", "token_bucket"} {
		if _, err := ParseAlgorithm(in); err == nil || !strings.Contains(err.Error(), "sliding_window_log, sliding_window_counter, fixed_window, gcra") {
			t.Errorf("ParseAlgorithm(%q) error = %v, want one naming the choices", in, err)
		}
	}
}

func TestParseFailureMode(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want FailureMode
	}{
		{"allow", FailureAllow},
		{"deny", FailureDeny},
	} {
		got, err := ParseFailureMode(tt.in)
		if err != nil || got != tt.want || got.String() != tt.in {
			t.Errorf("ParseFailureMode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	// Deferring to Envoy is what a rule without failure_mode does; the
	// YAML cannot spell it.
	for _, in := range []string{"Deny", "defer", ""} {
		if _, err := ParseFailureMode(in); err == nil || !strings.Contains(err.Error(), "allow, deny") {
			t.Errorf("ParseFailureMode(%q) error = %v, want one naming the choices", in, err)
		}
	}
	if got := FailureDefer.String(); got != "defer" || FailureDefer != 0 {
		t.Errorf("FailureDefer = %d %q, want the zero value, shown as defer", FailureDefer, got)
	}
}

func TestParseUnit(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Unit
		name string
		dur  time.Duration
	}{
		{"second", Second, "SECOND", time.Second},
		{"MINUTE", Minute, "MINUTE", time.Minute},
		{"Hour", Hour, "HOUR", time.Hour},
		{"day", Day, "DAY", 24 * time.Hour},
		{"week", Week, "WEEK", 7 * 24 * time.Hour},
		{"month", Month, "MONTH", 30 * 24 * time.Hour},
		{"year", Year, "YEAR", 365 * 24 * time.Hour},
	} {
		got, err := ParseUnit(tt.in)
		if err != nil || got != tt.want || got.String() != tt.name || got.Duration() != tt.dur {
			t.Errorf("ParseUnit(%q) = %v (%v), %v; want %v (%v)", tt.in, got, got.Duration(), err, tt.name, tt.dur)
		}
	}
	for _, in := range []string{"", "unknown", "seconds", "1s"} {
		if _, err := ParseUnit(in); err == nil {
			t.Errorf("ParseUnit(%q) succeeded, want an error", in)
		}
	}
}

func TestInvalidEnumValues(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{Algorithm(0).String(), "Algorithm(0)"},
		{FailureMode(9).String(), "FailureMode(9)"},
		{Unit(8).String(), "Unit(8)"},
	} {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
	if d := Unit(0).Duration() + Unit(8).Duration(); d != 0 {
		t.Errorf("Duration of invalid units = %v, want 0", d)
	}
}

func TestWindow(t *testing.T) {
	for _, tt := range []struct {
		r    Rule
		want time.Duration
	}{
		{Rule{Unit: Minute, UnitMultiplier: 1}, time.Minute},
		{Rule{Unit: Minute, UnitMultiplier: 15}, 15 * time.Minute},
		{Rule{Unlimited: true, UnitMultiplier: 1}, 0},
	} {
		if got := tt.r.Window(); got != tt.want {
			t.Errorf("Window() of %v x%d = %v, want %v", tt.r.Unit, tt.r.UnitMultiplier, got, tt.want)
		}
	}
}
