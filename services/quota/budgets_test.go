package quota

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		want    map[string]Budget
		wantErr string // a substring; "" for none
	}{
		{name: "empty", file: "", want: map[string]Budget{}},
		{name: "comments and blanks", file: "# budgets\n\n  # indented\n", want: map[string]Budget{}},
		{name: "the issue's example", file: "alice rpm=600 tpm=200000 weight=4\n",
			want: map[string]Budget{"alice": {RPM: 600, TPM: 200000, Weight: 4}}},
		{name: "every key", file: "bob rpm=1 tpm=2 concurrent=3 log=0.25 weight=0.5 # trailing comment\ncarol\n",
			want: map[string]Budget{"bob": {RPM: 1, TPM: 2, Concurrent: 3, Weight: 0.5, Log: 0.25}, "carol": {}}},
		{name: "the whole log is no share", file: "a log=1\n", want: map[string]Budget{"a": {}}},
		{name: "two lines for one tenant", file: "a rpm=1\na tpm=2\n", wantErr: "line 2: tenant a has a line already"},
		{name: "unknown key", file: "a rps=1\n", wantErr: `line 1: tenant a: unknown key "rps"`},
		{name: "not key=value", file: "a rpm\n", wantErr: `"rpm": want key=value`},
		{name: "empty value", file: "a rpm=\n", wantErr: `"rpm=": want key=value`},
		{name: "zero rpm", file: "a rpm=0\n", wantErr: "rpm=0: want a whole number"},
		{name: "negative tpm", file: "a tpm=-5\n", wantErr: "tpm=-5: want a whole number"},
		{name: "fractional concurrent", file: "a concurrent=1.5\n", wantErr: "concurrent=1.5"},
		{name: "zero weight", file: "a weight=0\n", wantErr: "weight=0: want a number above 0"},
		{name: "NaN weight", file: "a weight=NaN\n", wantErr: "weight=NaN"},
		{name: "log above 1", file: "a log=1.5\n", wantErr: "log=1.5: want a share above 0, at most 1"},
		{name: "no share", file: "a log=0\n", wantErr: "log=0: want a share above 0"},
		{name: "key twice", file: "a rpm=1 rpm=2\n", wantErr: "rpm given twice"},
		{name: "bad tenant", file: "a:b rpm=1\n", wantErr: `tenant "a:b"`},
		{name: "every problem reported", file: "a rpm=x\nb tpm=y\n", wantErr: "line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("tenant %s: got %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

func TestBudgetsFor(t *testing.T) {
	b := Budgets{Default: Budget{RPM: 10, TPM: 1000}, Tenants: map[string]Budget{
		"alice": {RPM: 600, Weight: 4},
		"bob":   {TPM: 5, Concurrent: 2},
	}}
	for _, tc := range []struct {
		tenant string
		want   Budget
	}{
		{"alice", Budget{RPM: 600, TPM: 1000, Weight: 4}},
		{"bob", Budget{RPM: 10, TPM: 5, Concurrent: 2, Weight: 1}},
		{"nobody", Budget{RPM: 10, TPM: 1000, Weight: 1}},
	} {
		if got := b.For(tc.tenant); got != tc.want {
			t.Errorf("For(%s): got %+v, want %+v", tc.tenant, got, tc.want)
		}
	}
	if !b.Shared() {
		t.Error("Shared: got false, want true")
	}
	if (Budgets{Tenants: map[string]Budget{"a": {Concurrent: 1}}}).Shared() {
		t.Error("Shared of concurrency alone: got true, want false (no per-minute budget, no bucket traffic)")
	}
}

func TestHash(t *testing.T) {
	a, _ := Parse([]byte("alice rpm=600\nbob tpm=5\n"))
	b, _ := Parse([]byte("# same, reordered\nbob tpm=5\nalice   rpm=600\n"))
	c, _ := Parse([]byte("alice rpm=601\nbob tpm=5\n"))
	ha, hb, hc := Budgets{Tenants: a}.Hash(), Budgets{Tenants: b}.Hash(), Budgets{Tenants: c}.Hash()
	if ha != hb {
		t.Errorf("the same budgets hash apart: %s, %s", ha, hb)
	}
	if ha == hc {
		t.Errorf("different budgets hash alike: %s", ha)
	}
	if hd := (Budgets{Default: Budget{RPM: 1}, Tenants: a}).Hash(); hd == ha {
		t.Errorf("different defaults hash alike: %s", hd)
	}
}

// FuzzParse: any file parses or fails without a panic, and what parses
// holds only budgets the parser's own rules allow.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"alice rpm=600 tpm=200000 weight=4\n", "# c\nb concurrent=2 log=0.5\n", "a rpm=1 rpm=2", "x weight=1e400", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data)
		if err != nil {
			return
		}
		for tenant, b := range got {
			if tenant == "" || b.RPM < 0 || b.TPM < 0 || b.Concurrent < 0 || b.Weight < 0 || b.RPM > maxPerMinute || b.TPM > maxPerMinute {
				t.Fatalf("parsed %q into tenant %q budget %+v", data, tenant, b)
			}
		}
	})
}
