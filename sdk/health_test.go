package sdk

import (
	"fmt"
	"slices"
	"testing"
)

func TestNoticeList(t *testing.T) {
	n := func(i int) Notice { return Notice{Subject: fmt.Sprintf("object %d", i), Message: "bad"} }
	for _, tc := range []struct {
		name  string
		max   int
		added int
		want  []Notice
	}{
		{"nothing added", 3, 0, nil},
		{"under the bound", 3, 2, []Notice{n(0), n(1)}},
		{"at the bound", 3, 3, []Notice{n(0), n(1), n(2)}},
		{"one over", 3, 4, []Notice{n(0), n(1), n(2), {Subject: "service web", Message: "and 1 more not shown"}}},
		{"many over", 2, 1002, []Notice{n(0), n(1), {Subject: "service web", Message: "and 1000 more not shown"}}},
		{"keep none", 0, 5, []Notice{{Subject: "service web", Message: "and 5 more not shown"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NoticeList{Max: tc.max, Subject: "service web"}
			for i := range tc.added {
				l.Add(n(i))
			}
			if got := l.List(); !slices.Equal(got, tc.want) {
				t.Errorf("List() = %v, want %v", got, tc.want)
			}
			if l.Len() != tc.added {
				t.Errorf("Len() = %d, want %d", l.Len(), tc.added)
			}
		})
	}
}

func TestNoticeListDoesNotAlias(t *testing.T) {
	l := NoticeList{Max: 2, Subject: "s"}
	l.Add(Notice{Subject: "a"}, Notice{Subject: "b"}, Notice{Subject: "c"})
	first := l.List()
	l.Add(Notice{Subject: "d"})
	if first[2].Message != "and 1 more not shown" {
		t.Errorf("a later Add changed an earlier List: %v", first)
	}
}
