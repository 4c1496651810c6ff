package grpcunary

import (
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHeaderParser(t *testing.T) {
	call := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/s/M"}, {Name: ":authority", Value: "rls"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}
	with := func(extra ...hpack.HeaderField) []hpack.HeaderField {
		return append(append([]hpack.HeaderField{}, call...), extra...)
	}
	without := func(name string) []hpack.HeaderField {
		var out []hpack.HeaderField
		for _, f := range call {
			if f.Name != name {
				out = append(out, f)
			}
		}
		return out
	}
	replaced := func(name, value string) []hpack.HeaderField {
		out := with()
		for i := range out {
			if out[i].Name == name {
				out[i].Value = value
			}
		}
		return out
	}
	tests := []struct {
		name      string
		fields    []hpack.HeaderField
		wantErr   error      // errMalformed, or nil
		wantCode  codes.Code // a status error's code
		wantHTTP  int        // an httpError's status
		truncated bool
		check     func(t *testing.T, req request)
	}{
		{name: "a call", fields: with(hpack.HeaderField{Name: "grpc-timeout", Value: "20m"}, hpack.HeaderField{Name: "user-agent", Value: "envoy"}),
			check: func(t *testing.T, req request) {
				if req.path != "/s/M" || req.timeout != 20*time.Millisecond || req.contentLength != -1 {
					t.Errorf("%+v", req)
				}
				if got := req.md.Get("user-agent"); len(got) != 1 || got[0] != "envoy" {
					t.Errorf("user-agent %q", got)
				}
				if got := req.md.Get(":authority"); len(got) != 1 || got[0] != "rls" {
					t.Errorf(":authority %q", got)
				}
				for _, k := range []string{"content-type", "te", "grpc-timeout", ":path"} {
					if req.md.Get(k) != nil {
						t.Errorf("%s in metadata", k)
					}
				}
			}},
		{name: "repeated and binary metadata", fields: with(
			hpack.HeaderField{Name: "x-a", Value: "1"}, hpack.HeaderField{Name: "x-b", Value: "2"},
			hpack.HeaderField{Name: "x-a", Value: "3"}, hpack.HeaderField{Name: "x-id-bin", Value: "AAH/"}),
			check: func(t *testing.T, req request) {
				if got := strings.Join(req.md.Get("x-a"), ","); got != "1,3" {
					t.Errorf("x-a %q", got)
				}
				if got := strings.Join(req.md.Get("x-b"), ","); got != "2" {
					t.Errorf("x-b %q: the values of x-a ran over it", got)
				}
				if got := req.md.Get("x-id-bin"); len(got) != 1 || got[0] != "\x00\x01\xff" {
					t.Errorf("x-id-bin %q", got)
				}
			}},
		{name: "content-length", fields: with(hpack.HeaderField{Name: "content-length", Value: "12"}),
			check: func(t *testing.T, req request) {
				if req.contentLength != 12 {
					t.Errorf("content-length %d", req.contentLength)
				}
			}},
		{name: "no :method", fields: without(":method"), wantErr: errMalformed},
		{name: "no :scheme", fields: without(":scheme"), wantErr: errMalformed},
		{name: "empty :path", fields: replaced(":path", ""), wantErr: errMalformed},
		{name: "pseudo-header twice", fields: with(hpack.HeaderField{Name: ":path", Value: "/s/N"}), wantErr: errMalformed},
		{name: "pseudo-header after a regular one", fields: append([]hpack.HeaderField{{Name: "x-a", Value: "1"}}, call...), wantErr: errMalformed},
		{name: "unknown pseudo-header", fields: append([]hpack.HeaderField{{Name: ":protocol", Value: "x"}}, call...), wantErr: errMalformed},
		{name: "a response's pseudo-header", fields: append([]hpack.HeaderField{{Name: ":status", Value: "200"}}, call...), wantErr: errMalformed},
		{name: "upper case name", fields: with(hpack.HeaderField{Name: "X-A", Value: "1"}), wantErr: errMalformed},
		{name: "value with a line break", fields: with(hpack.HeaderField{Name: "x-a", Value: "1\r\n2"}), wantErr: errMalformed},
		{name: "connection header", fields: with(hpack.HeaderField{Name: "connection", Value: "keep-alive"}), wantErr: errMalformed},
		{name: "te other than trailers", fields: replaced("te", "gzip"), wantErr: errMalformed},
		{name: "content-length not a number", fields: with(hpack.HeaderField{Name: "content-length", Value: "-1"}), wantErr: errMalformed},
		{name: "not gRPC", fields: replaced("content-type", "application/json"), wantHTTP: 415},
		{name: "another codec", fields: replaced("content-type", "application/grpc+json"), wantHTTP: 415},
		{name: "proto codec named", fields: replaced("content-type", "application/grpc+proto")},
		{name: "GET", fields: replaced(":method", "GET"), wantHTTP: 405},
		{name: "bad grpc-timeout", fields: with(hpack.HeaderField{Name: "grpc-timeout", Value: "1y"}), wantCode: codes.Internal},
		{name: "compressed", fields: with(hpack.HeaderField{Name: "grpc-encoding", Value: "gzip"}), wantCode: codes.Unimplemented},
		{name: "identity encoding", fields: with(hpack.HeaderField{Name: "grpc-encoding", Value: "identity"})},
		{name: "bad binary metadata", fields: with(hpack.HeaderField{Name: "x-id-bin", Value: "!!"}), wantCode: codes.Internal},
		{
			name:   "header list past the bound",
			fields: with(hpack.HeaderField{Name: "x-big", Value: strings.Repeat("v", MaxHeaderListSize)}), truncated: true,
		},
	}
	var p headerParser
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.reset() // one parser for all, as a connection has
			for _, f := range tt.fields {
				p.field(f)
			}
			if p.truncated != tt.truncated {
				t.Fatalf("truncated %v, want %v", p.truncated, tt.truncated)
			}
			if tt.truncated {
				return
			}
			req, err := p.result()
			var he *httpError
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
			case tt.wantHTTP != 0:
				if !errors.As(err, &he) || he.status != tt.wantHTTP {
					t.Fatalf("error %v, want HTTP %d", err, tt.wantHTTP)
				}
			case tt.wantCode != codes.OK:
				if status.Code(err) != tt.wantCode {
					t.Fatalf("error %v, want %v", err, tt.wantCode)
				}
			case err != nil:
				t.Fatalf("error %v", err)
			}
			if tt.check != nil {
				tt.check(t, req)
			}
		})
	}
}
