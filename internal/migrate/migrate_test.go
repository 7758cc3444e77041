package migrate

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

func TestLoadOrdersAndValidates(t *testing.T) {
	fsys := fstest.MapFS{
		"m/002_b.sql": {Data: []byte("SELECT 2;")},
		"m/001_a.sql": {Data: []byte("SELECT 1;")},
		"m/README.md": {Data: []byte("not sql")},
		"m/010_c.sql": {Data: []byte("SELECT 10;")},
	}
	ms, err := Load(fsys, "m")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 10}, []int{ms[0].Version, ms[1].Version, ms[2].Version})

	_, err = Load(fstest.MapFS{"m/x_a.sql": {Data: []byte("")}}, "m")
	require.ErrorContains(t, err, "NNN_")
	_, err = Load(fstest.MapFS{"m/001_a.sql": {}, "m/001_b.sql": {}}, "m")
	require.ErrorContains(t, err, "share version 1")
}

func TestStatements(t *testing.T) {
	src := `-- header comment
CREATE TABLE {{table}} (
  id INT -- trailing comments stay inside a statement
);

-- another
CREATE INDEX i ON {{table}} (id);
SELECT 1`
	got := Statements(src, strings.NewReplacer("{{table}}", "p_t"))
	require.Len(t, got, 3)
	require.True(t, strings.HasPrefix(got[0], "CREATE TABLE p_t ("), got[0])
	require.False(t, strings.HasSuffix(got[0], ";"))
	require.Equal(t, "CREATE INDEX i ON p_t (id)", got[1])
	require.Equal(t, "SELECT 1", got[2])
}

func TestScriptRecordsTheStep(t *testing.T) {
	p := Part{Name: "txlog", Replace: map[string]string{"{{table}}": "p_t"}}
	m := Migration{Version: 3, Name: "003_add.sql", SQL: "-- c\nCREATE TABLE {{table}} (\n  id INT\n);\nCREATE INDEX i ON {{table}} (id);\n"}
	for _, d := range dialect.All() {
		s, err := Script(d, "p_schema_migrations", p, m)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(s, "CREATE TABLE p_t (\n  id INT\n);\n\nCREATE INDEX i ON p_t (id);\n"), s)
		require.Contains(t, s, "CREATE TABLE IF NOT EXISTS p_schema_migrations")
		require.Contains(t, s, "p_schema_migrations (part, version, name, applied_at) VALUES ('txlog', 3, '003_add.sql', "+d.Now()+")")
		require.Len(t, Statements(s, nil), 4, "every statement ends with ';' at the end of a line")
	}
	_, err := Script(dialect.MySQL, "v", Part{Name: "x'); DROP TABLE t; --"}, m)
	require.Error(t, err, "names are literals of a fixed alphabet")
}
