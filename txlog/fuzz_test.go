package txlog

import (
	"strings"
	"testing"
	"time"
)

// FuzzFilterWhere builds listing filters from arbitrary operator input (the
// runbook CLI passes flags straight into a Filter). Nothing panics, every
// value is bound: the SQL has exactly one placeholder per argument and never
// depends on the values, and the same filter always gives the same
// SQL (I10: values always bound, never formatted into SQL).
func FuzzFilterWhere(f *testing.F) {
	f.Add("pg-1", "COMMITTED", "FENCE", "REPUBLISHED", int8(1), int64(1700000000), int64(0), "0190a1b2")
	f.Add("' OR 1=1 -- ", "ROLLED_BACK' ;DROP TABLE x;", "", "", int8(-1), int64(0), int64(-1), "")
	f.Add("", "", "", "", int8(0), int64(0), int64(0), "?")
	f.Fuzz(func(t *testing.T, group, state, by, decision string, recovered int8, before, after int64, afterID string) {
		fl := Filter{Group: group, State: State(state), ResolvedBy: ResolvedBy(by), RecoveryDecision: RecoveryDecision(decision)}
		if recovered != 0 {
			r := recovered > 0
			fl.Recovered = &r
		}
		if before != 0 {
			fl.CreatedBefore = time.Unix(before%(1<<33), 0)
		}
		if after != 0 {
			fl.CreatedAfter = time.Unix(after%(1<<33), 0)
		}
		if afterID != "" {
			fl.After = &Row{EventID: afterID, CreatedAt: time.Unix(1700000000, 0)}
		}
		sql, args := fl.where()
		if n := strings.Count(sql, "?"); n != len(args) {
			t.Fatalf("%d placeholders for %d arguments in %q", n, len(args), sql)
		}
		// The SQL depends on which fields are set, never on their values.
		shape := fl
		for _, v := range []*string{&shape.Group, (*string)(&shape.State), (*string)(&shape.ResolvedBy), (*string)(&shape.RecoveryDecision)} {
			if *v != "" {
				*v = "x"
			}
		}
		if fl.After != nil {
			shape.After = &Row{EventID: "x", CreatedAt: time.Unix(1, 0)}
		}
		if !shape.CreatedBefore.IsZero() {
			shape.CreatedBefore = time.Unix(2, 0)
		}
		if shapeSQL, _ := shape.where(); shapeSQL != sql {
			t.Fatalf("values changed the SQL: %q vs %q", sql, shapeSQL)
		}
		if again, _ := fl.where(); again != sql {
			t.Fatalf("not deterministic: %q then %q", sql, again)
		}
		if sql != "" && !strings.HasPrefix(sql, " WHERE ") {
			t.Fatalf("bad clause %q", sql)
		}
	})
}
