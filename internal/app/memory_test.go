package app

import (
	"bytes"
	"runtime/debug"
	"testing"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// TestMemoryLimit: the flag's default, 0 for none, and GOMEMLIMIT winning
// over the flag. The runtime's settings are restored after.
func TestMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	gcPercent := debug.SetGCPercent(100)
	defer debug.SetGCPercent(gcPercent)
	const none = 1<<63 - 1
	for _, tc := range []struct {
		name, gomemlimit string
		args             []string
		want             int64 // in force after
	}{
		{"default", "", nil, settings.DefaultMemoryLimit},
		{"flag", "", []string{"--memory-limit", "64MiB"}, 64 << 20},
		{"none", "", []string{"--memory-limit", "0"}, 0},
		{"GOMEMLIMIT wins", "100MiB", []string{"--memory-limit", "64MiB"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tc.gomemlimit)
			t.Setenv("GOGC", "")
			debug.SetGCPercent(100)
			const before = 123 << 20 // as if the runtime had read GOMEMLIMIT
			debug.SetMemoryLimit(before)
			if tc.want == 0 {
				debug.SetMemoryLimit(none)
			}
			var s settings.Settings
			if err := settings.Parse(settings.NewFlagSet("test", &s, &bytes.Buffer{}), &s, tc.args); err != nil {
				t.Fatal(err)
			}
			got := setRuntimeDefaults(int64(s.MemoryLimit))
			want := tc.want
			if want == -1 {
				want = before // left as the runtime set it
			}
			if got != want || (want != 0 && debug.SetMemoryLimit(-1) != want) {
				t.Fatalf("memory limit %d (runtime %d), want %d", got, debug.SetMemoryLimit(-1), want)
			}
			if gc := debug.SetGCPercent(100); gc != 400 {
				t.Fatalf("GC target %d%%, want 400%% with GOGC empty", gc)
			}
		})
	}
}
