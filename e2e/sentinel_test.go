package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover: the service finds the master through the
// sentinels; the master is killed under load; every request is answered
// within the store deadline, by failure mode until the sentinels have
// promoted the replica, and by real decisions after.
func TestSentinelFailover(t *testing.T) {
	sn := startSentinel(t)
	const storeTimeout = 200 * time.Millisecond
	s := startServer(t, nil, clusterConfig, "--redis-sentinel-url", sn.url(), "--store-timeout", storeTimeout.String())
	avoidMidnight(t, 60*time.Second)

	// Decisions are real, and land on the master.
	tripsAtExactly(t, s, "fo_check", "before", 5)
	if n := windowCount(t, sn.master.client, dayKey("fo_check", "before", "counter")); n != 5 {
		t.Fatalf("the master holds %d for fo_check=before, want 5", n)
	}
	if strings.Contains(s.logs.String(), "store unavailable") {
		t.Fatal("a failure mode answered before the kill")
	}

	var targets []failoverTarget
	for i := range 5 {
		for _, rule := range []string{"fo_allow", "fo_deny"} {
			targets = append(targets, failoverTarget{rule, fmt.Sprintf("s%d", i), true})
		}
	}
	run := runFailoverLoad(t, s, targets, 20, 2*time.Second, 25*time.Second, func() { sn.master.kill() })
	run.check(t, targets, storeTimeout, "sentinel")
	s.waitLog(t, "store unavailable")
	// The sentinels name the replica, and decisions are real again.
	waitFor(t, 10*time.Second, func() error {
		if got := sn.masterAddr(t); got != sn.replica.addr {
			return fmt.Errorf("the sentinels name %s, want the replica %s", got, sn.replica.addr)
		}
		return nil
	})
	tripsAtExactly(t, s, "fo_check", "after", 5)
	// The counter that tripped before the kill was replicated: it is still
	// full on the promoted replica.
	if resp := s.ask(t, request("e2e", descriptor("fo_check", "before"))); resp.OverallCode != over {
		t.Errorf("fo_check=before after the failover: %v, want still over its limit", resp)
	}
}
