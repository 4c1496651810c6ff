package e2e

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/slidingwindow/ratelimit/proto/ratelimit/admin/v1"
)

func TestAdminAPI(t *testing.T) {
	t.Parallel()
	adminAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := startServer(t, startRedis(t), testConfig, "--admin-addr", adminAddr)
	admin := adminv1.NewAdminClient(insecureConn(t, adminAddr))
	ctx := context.Background()
	entries := []*adminv1.Entry{{Key: "log", Value: "adm"}}

	for i := 0; i < 3; i++ {
		s.ask(t, request("e2e", descriptor("log", "adm")))
	}
	for i := 0; i < 2; i++ { // twice: Inspect consumes nothing
		got, err := admin.Inspect(ctx, &adminv1.InspectRequest{Domain: "e2e", Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		if !got.Matched || got.Algorithm != "sliding_window_log" || got.Used != 3 || got.Remaining != 2 || got.Key != "rl:{e2e|log=adm}:log:60" {
			t.Fatalf("Inspect %d: %v", i, got)
		}
	}
	reset, err := admin.Reset(ctx, &adminv1.ResetRequest{Domain: "e2e", Entries: entries})
	if err != nil || reset.Deleted != 1 {
		t.Fatalf("Reset: %v, %v", reset, err)
	}
	if st := s.ask(t, request("e2e", descriptor("log", "adm"))).Statuses[0]; st.LimitRemaining != 4 {
		t.Fatalf("after Reset: %v, want the whole limit back (4 left after this hit)", st)
	}

	// The admin API is not on the port Envoy reaches.
	_, err = adminv1.NewAdminClient(s.conn).Reset(ctx, &adminv1.ResetRequest{Domain: "e2e", Entries: entries})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("Reset on the rate limit port: %v, want Unimplemented", err)
	}
}
