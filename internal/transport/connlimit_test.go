package transport

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// TestLimitListener: past its bound a connection is closed at accept and
// counted, never handed out; closing one handed out makes room for the
// next, once however often it is closed.
func TestLimitListener(t *testing.T) {
	for _, tc := range []struct {
		name            string
		max, dials      int
		wantOpen        int
		wantRefused     float64
		closeThenRedial bool
	}{
		{name: "within the bound", max: 3, dials: 3, wantOpen: 3},
		{name: "past the bound", max: 2, dials: 5, wantOpen: 2, wantRefused: 3},
		{name: "room again after a close", max: 1, dials: 1, wantOpen: 1, closeThenRedial: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := metrics.New(reg)
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := LimitListener(inner, tc.max, m)
			defer ln.Close()
			accepted := make(chan net.Conn, tc.dials+1)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						close(accepted)
						return
					}
					accepted <- c
				}
			}()

			var clients []net.Conn
			defer func() {
				for _, c := range clients {
					_ = c.Close()
				}
			}()
			dial := func() net.Conn {
				c, err := net.Dial("tcp", inner.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
				return c
			}
			for range tc.dials {
				dial()
			}
			var served []net.Conn
			for range tc.wantOpen {
				select {
				case c := <-accepted:
					served = append(served, c)
				case <-time.After(5 * time.Second):
					t.Fatalf("%d connections handed out, want %d", len(served), tc.wantOpen)
				}
			}
			// The refused ones see their connection closed.
			for _, c := range clients[tc.wantOpen:] {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("a connection past the bound: read %v, want it closed", err)
				}
			}
			select {
			case c := <-accepted:
				t.Fatalf("a connection past the bound was handed out: %v", c.RemoteAddr())
			case <-time.After(50 * time.Millisecond):
			}
			if got := sample(t, reg, "ratelimit_transport_refusals_total", RefusedConnection); got != tc.wantRefused {
				t.Errorf("refusals counted %v, want %v", got, tc.wantRefused)
			}
			if got := sample(t, reg, "ratelimit_grpc_connections", ""); got != float64(tc.wantOpen) {
				t.Errorf("ratelimit_grpc_connections %v, want %d", got, tc.wantOpen)
			}

			if tc.closeThenRedial {
				for range 2 { // a second close frees nothing more
					_ = served[0].Close()
				}
				dial()
				select {
				case c := <-accepted:
					_ = c.Close()
				case <-time.After(5 * time.Second):
					t.Fatal("no room after a connection closed")
				}
				if got := sample(t, reg, "ratelimit_grpc_connections", ""); got != 0 {
					t.Errorf("ratelimit_grpc_connections %v after both closed, want 0", got)
				}
				return
			}
			for _, c := range served {
				_ = c.Close()
			}
		})
	}
}

// sample is the value of metric name in reg: of its series whose reason
// label is reason, or its only series when reason is empty; 0 when absent.
func sample(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if reason != "" && !hasLabel(m.GetLabel(), "reason", reason) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func hasLabel(labels []*dto.LabelPair, name, value string) bool {
	for _, l := range labels {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
