package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/algorithm"
)

// Algorithm names a rate limit algorithm. Its values are the IDs of
// internal/algorithm's table, which names them: a new algorithm is added
// there, with its Lua file, and needs no change here but a constant for
// code that names it.
type Algorithm uint8

// The algorithms a rule can ask for with rate_limit.algorithm.
// TestParseAlgorithm checks that each is the one its comment names.
const (
	SlidingWindowLog     Algorithm = iota + 1 // "sliding_window_log": exact, one entry per request
	SlidingWindowCounter                      // "sliding_window_counter": two counters, weighted
	FixedWindow                               // "fixed_window": one counter, as envoyproxy/ratelimit
	GCRA                                      // "gcra": a token bucket of Rule.Burst units, refilled at the rate
	ReferenceFixedWindow                      // "reference_fixed_window": envoyproxy/ratelimit's own counters and keys
)

// algorithmNames are indexed by Algorithm, as parseEnum wants: the table
// holds IDs 1, 2, ... in order (internal/algorithm's TestTable).
var algorithmNames = func() []string {
	names := []string{""}
	for _, a := range algorithm.All() {
		names = append(names, a.Name)
	}
	return names
}()

// Algorithms returns every algorithm, in order.
func Algorithms() []Algorithm {
	descriptors := algorithm.All()
	all := make([]Algorithm, 0, len(descriptors))
	for _, a := range descriptors {
		all = append(all, Algorithm(a.ID))
	}
	return all
}

// AlgorithmNames returns the names of every algorithm, in order, for help
// texts.
func AlgorithmNames() []string { return slices.Clone(algorithmNames[1:]) }

// ParseAlgorithm returns the algorithm named s, which must be spelled exactly
// as in the config file.
func ParseAlgorithm(s string) (Algorithm, error) {
	return parseEnum[Algorithm]("algorithm", s, algorithmNames, equal)
}

// describe is a's entry in internal/algorithm's table, or an empty one.
func (a Algorithm) describe() *algorithm.Descriptor {
	d, ok := algorithm.ByID(int(a))
	if !ok {
		return &algorithm.Descriptor{}
	}
	return d
}

// bucketNames are the token bucket algorithms, whose rules take
// rate_limit.burst.
var bucketNames = func() []string {
	var names []string
	for _, a := range algorithm.All() {
		if a.Bucket {
			names = append(names, a.Name)
		}
	}
	return names
}()

// Bucket reports a token bucket: its rules take rate_limit.burst.
func (a Algorithm) Bucket() bool { return a.describe().Bucket }

// ReferenceKeys reports an algorithm counting at envoyproxy/ratelimit's own
// keys, one per window start.
func (a Algorithm) ReferenceKeys() bool { return a.describe().ReferenceKeys }

// CheckLimit refuses a limit above the algorithm's bound, if it has one.
func (a Algorithm) CheckLimit(limit uint32) error {
	if d := a.describe(); d.MaxLimit != 0 && limit > d.MaxLimit {
		return fmt.Errorf("%d is above the %s maximum of %d (%s)", limit, d.Name, d.MaxLimit, d.MaxLimitWhy)
	}
	return nil
}

// String returns the name ParseAlgorithm accepts.
func (a Algorithm) String() string { return enumString("Algorithm", a, algorithmNames) }

// FailureMode is the answer when the store cannot decide a hit.
type FailureMode uint8

// The failure modes. A rule asks for allow or deny with
// rate_limit.failure_mode; one that names none defers to Envoy.
const (
	// FailureDefer, the zero value, is a rule without failure_mode: the
	// request fails with gRPC UNAVAILABLE, so Envoy's own failure_mode_deny
	// decides, as with envoyproxy/ratelimit. Not accepted in the YAML.
	FailureDefer FailureMode = iota
	FailureAllow             // "allow": let the request through
	FailureDeny              // "deny": answer OVER_LIMIT
)

var failureModeNames = []string{
	FailureAllow: "allow",
	FailureDeny:  "deny",
}

// ParseFailureMode returns the failure mode named s, which must be spelled
// exactly as in the config file.
func ParseFailureMode(s string) (FailureMode, error) {
	return parseEnum[FailureMode]("failure_mode", s, failureModeNames, equal)
}

// String returns the name ParseFailureMode accepts, or "defer" for
// FailureDefer.
func (f FailureMode) String() string {
	if f == FailureDefer {
		return "defer"
	}
	return enumString("FailureMode", f, failureModeNames)
}

// CostRecording says which costs are recorded even when they do not fit
// their limit: costs spent before they are reported (Envoy's
// apply_on_stream_done), which become a debt instead of being refused.
type CostRecording uint8

// The cost recordings of rate_limit.record_costs and --record-costs.
const (
	// RecordDescriptorCosts, the default: a cost given by the descriptor's
	// own hits_addend is recorded. That is how Envoy sends the cost of a
	// route's rate_limits entry with hits_addend, which is how
	// apply_on_stream_done reports costs (Envoy Gateway's cost.response,
	// Envoy AI Gateway's token quotas). A request-level hits_addend, and the
	// default cost of 1, are charged only when they fit.
	RecordDescriptorCosts CostRecording = iota + 1 // "descriptor"
	RecordAllCosts                                 // "always": every cost, as envoyproxy/ratelimit charges
	RecordNoCosts                                  // "never": a cost that does not fit is never charged
)

var costRecordingNames = []string{
	RecordDescriptorCosts: "descriptor",
	RecordAllCosts:        "always",
	RecordNoCosts:         "never",
}

// ParseCostRecording returns the cost recording named s, which must be
// spelled exactly as in the config file.
func ParseCostRecording(s string) (CostRecording, error) {
	return parseEnum[CostRecording]("record_costs", s, costRecordingNames, equal)
}

// String returns the name ParseCostRecording accepts.
func (r CostRecording) String() string { return enumString("CostRecording", r, costRecordingNames) }

// Records reports whether a cost is recorded even when it does not fit;
// fromDescriptor says that the descriptor's own hits_addend gave it.
func (r CostRecording) Records(fromDescriptor bool) bool {
	return r == RecordAllCosts || r == RecordDescriptorCosts && fromDescriptor
}

// Unit is a rate limit time unit.
type Unit uint8

// The units of rate_limit.unit. Their numbers are not Envoy's (its WEEK is 7): map by name.
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
	Week
	Month
	Year
)

// unitNames are Envoy's enum names, which the responses carry.
var unitNames = []string{
	Second: "SECOND",
	Minute: "MINUTE",
	Hour:   "HOUR",
	Day:    "DAY",
	Week:   "WEEK",
	Month:  "MONTH",
	Year:   "YEAR",
}

var unitDurations = []time.Duration{
	Second: time.Second,
	Minute: time.Minute,
	Hour:   time.Hour,
	Day:    24 * time.Hour,
	Week:   7 * 24 * time.Hour,
	Month:  30 * 24 * time.Hour,
	Year:   365 * 24 * time.Hour,
}

// ParseUnit returns the unit named s in any case ("minute", "MINUTE"), as
// envoyproxy/ratelimit accepts it.
func ParseUnit(s string) (Unit, error) {
	return parseEnum[Unit]("unit", s, unitNames, strings.EqualFold)
}

// String returns Envoy's enum name, e.g. "MINUTE".
func (u Unit) String() string { return enumString("Unit", u, unitNames) }

// Duration returns the length of one unit; months and years have a fixed
// length (30 and 365 days), as in the reference: the length of a sliding
// window or a bucket of that unit. A fixed window of weeks, months or years
// follows the calendar instead (CalendarOf).
func (u Unit) Duration() time.Duration {
	if int(u) >= len(unitDurations) {
		return 0
	}
	return unitDurations[u]
}

func equal(a, b string) bool { return a == b }

// parseEnum returns the value whose name matches s; names is indexed by
// value and its entry 0 is unused, as the zero value means "not set".
func parseEnum[T ~uint8](kind, s string, names []string, match func(a, b string) bool) (T, error) {
	for v := 1; v < len(names); v++ {
		if match(s, names[v]) {
			return T(v), nil
		}
	}
	return 0, fmt.Errorf("unknown %s %q, want one of %s", kind, s, strings.ToLower(strings.Join(names[1:], ", ")))
}

func enumString[T ~uint8](typ string, v T, names []string) string {
	if v == 0 || int(v) >= len(names) {
		return fmt.Sprintf("%s(%d)", typ, v)
	}
	return names[v]
}
