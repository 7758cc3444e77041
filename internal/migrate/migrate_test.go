package migrate

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
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
