package e2e

import (
	"context"
	"testing"

	lua "github.com/slidingwindow/ratelimit/scripts/lua"
)

// TestFunctionReplyAfterError: the decide function keeps its reply table
// across calls (a Functions library's locals outlive the call); a call that
// fails after writing part of its reply must leave nothing that a later,
// shorter call returns. The EVAL form and miniredis start every call afresh,
// so only a real redis-server shows it.
func TestFunctionReplyAfterError(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	ctx := context.Background()
	if err := r.client.FunctionLoad(ctx, lua.Library()).Err(); err != nil {
		t.Fatal(err)
	}
	fcall := func(keys []string, args ...any) ([]any, error) {
		return r.client.FCall(ctx, lua.DecideFunction(), keys, args...).Slice()
	}
	const fixed, log = "3:ce:10:60:1", "1:ce:10:60:1" // fixed_window and sliding_window_log, 10 a minute
	if _, err := fcall([]string{"{a}k1", "{a}k2"}, 1, fixed, 1, fixed); err != nil {
		t.Fatal(err)
	}
	// {a}bad is a hash: the log's check of it fails in the second request,
	// after the first request's four hits wrote 16 reply values.
	if err := r.client.HSet(ctx, "{a}bad", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := fcall([]string{"{a}k1", "{a}k2", "{a}k3", "{a}k4", "{a}bad"}, 4, fixed, fixed, fixed, fixed, 1, log); err == nil {
		t.Fatal("a log check of a hash: no error, want WRONGTYPE")
	}
	got, err := fcall([]string{"{a}k1", "{a}k2", "{a}k3"}, 3, fixed, fixed, fixed)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 12 {
		t.Errorf("3 hits answered with %d values, want 12: %v", len(got), got)
	}
}
