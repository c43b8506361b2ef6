package main

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestCallsThatCannotRunSayWhy(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "a subcommand is required"},
		{[]string{"frobnicate"}, `unknown subcommand "frobnicate"`},
		{[]string{"explain", "/x"}, "give one of --pod or --labels"},
		{[]string{"explain", "--pod", "p", "--labels", "a=b", "/x"}, "give one of --pod or --labels"},
		{[]string{"explain", "--pod", "p"}, "explain takes one PATH"},
		{[]string{"explain", "--pod", "p", "-H", "no-colon", "/x"}, `header "no-colon" is not 'Name: value'`},
		{[]string{"status", "a", "b"}, "status takes at most one POLICY"},
	} {
		err := run(context.Background(), tc.args, &bytes.Buffer{})
		if _, ok := errors.AsType[usageError](err); !ok || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%v: got %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
	// A path the sidecar refuses is said before any cluster is asked.
	err := run(context.Background(), []string{"explain", "--labels", "app=x", "/a%2Fb"}, &bytes.Buffer{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("400 bad_request_path")) {
		t.Errorf("an encoded slash: got %v", err)
	}
}
