package runplot

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"

	xfont "golang.org/x/image/font"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The pictures of `distflash eval`'s long-context tasks:
//
//   - passkey retrieval: per scoring a heat map of accuracy, context length across and the
//     key's depth in the filler down (0% at the top), each cell coloured by a viridis ramp
//     (dark purple 0 … yellow 1, lightness increasing with accuracy, readable with colour
//     blindness and in grey) and labelled with its accuracy and count; a colour bar on the
//     right;
//   - loss by position: one line per model of the mean loss of log-spaced position buckets
//     against position on a log axis, with the model's training length as a dashed vertical
//     line; a legend on the right.

// PasskeyGrid is one scoring's accuracy of passkey retrieval by context length and depth.
type PasskeyGrid struct {
	Title   string    // e.g. "generated (greedy)" or "teacher-forced"
	Lengths []int     // context lengths in tokens, ascending (the x axis, one column each)
	Depths  []float64 // the depth bins' centres in [0,1] (the y axis, one row each; 0 = key at the start of the filler)
	Correct [][]int   // Correct[i][j]: trials at Lengths[i], depth bin j, answered correctly
	Trials  [][]int   // Trials[i][j]: trials there (0: none; drawn as an empty/grey cell)
}

// WritePasskey draws the grids side by side (one panel each, sharing a colour scale from 0 to 1
// accuracy) into out (.png or .svg), with a title line `title`, and writes it atomically.
// Nothing is written on error.
func WritePasskey(out, title string, grids []PasskeyGrid) error {
	format, err := Format(out)
	if err != nil {
		return err
	}
	if err := checkPasskey(grids); err != nil {
		return fmt.Errorf("plot: passkey %s: %w", out, err)
	}
	var buf bytes.Buffer
	if err := drawPasskey(&buf, title, grids, format); err != nil {
		return fmt.Errorf("plot: draw %s: %w", out, err)
	}
	return writeFile(out, buf.Bytes())
}

// PositionSeries is one model's mean loss by token position.
type PositionSeries struct {
	Name     string    // legend label (the model)
	Lo, Hi   []int     // bucket i holds positions [Lo[i], Hi[i])
	Loss     []float64 // mean loss (nats/token) of the bucket; NaN where the bucket is empty
	Tokens   []int64   // tokens in the bucket
	TrainLen int       // the model's training length, drawn as a dashed vertical line in the series' colour; 0: none
}

// WritePositions draws loss against position (x: bucket centre, log scale base 2; y: loss,
// linear) with one line per series (markers at the buckets), into out (.png/.svg) atomically,
// with title line `title`. A bucket is drawn at its centre (Lo+Hi)/2, the mean position of
// its tokens when every sequence covers it, which is above 0 for any bucket; empty buckets
// (NaN loss) are left out and break the line. Nothing is written on error.
func WritePositions(out, title string, series []PositionSeries) error {
	format, err := Format(out)
	if err != nil {
		return err
	}
	if err := checkPositions(series); err != nil {
		return fmt.Errorf("plot: positions %s: %w", out, err)
	}
	var buf bytes.Buffer
	if err := drawPositions(&buf, title, series, format); err != nil {
		return fmt.Errorf("plot: draw %s: %w", out, err)
	}
	return writeFile(out, buf.Bytes())
}

// checkPasskey reports the first inconsistency of the grids, naming the grid and the cell.
func checkPasskey(grids []PasskeyGrid) error {
	if len(grids) == 0 {
		return errors.New("no grids")
	}
	for k, g := range grids {
		if err := checkGrid(g); err != nil {
			return fmt.Errorf("grid %d (%q): %w", k, g.Title, err)
		}
	}
	return nil
}

// checkGrid reports the first inconsistency of g.
func checkGrid(g PasskeyGrid) error {
	if len(g.Lengths) == 0 || len(g.Depths) == 0 {
		return fmt.Errorf("%d lengths and %d depths, want at least one of each", len(g.Lengths), len(g.Depths))
	}
	for i, n := range g.Lengths {
		if n <= 0 {
			return fmt.Errorf("context length Lengths[%d] = %d, want > 0", i, n)
		}
		if i > 0 && n <= g.Lengths[i-1] {
			return fmt.Errorf("context lengths not ascending: Lengths[%d] = %d after %d", i, n, g.Lengths[i-1])
		}
	}
	for j, d := range g.Depths {
		if !(d >= 0 && d <= 1) {
			return fmt.Errorf("depth Depths[%d] = %g, want in [0, 1]", j, d)
		}
		if j > 0 && d <= g.Depths[j-1] {
			return fmt.Errorf("depths not ascending: Depths[%d] = %g after %g", j, d, g.Depths[j-1])
		}
	}
	if len(g.Correct) != len(g.Lengths) || len(g.Trials) != len(g.Lengths) {
		return fmt.Errorf("%d rows of Correct and %d of Trials, want one per length (%d)", len(g.Correct), len(g.Trials), len(g.Lengths))
	}
	for i := range g.Lengths {
		if len(g.Correct[i]) != len(g.Depths) || len(g.Trials[i]) != len(g.Depths) {
			return fmt.Errorf("length %d: %d cells of Correct and %d of Trials, want one per depth (%d)",
				g.Lengths[i], len(g.Correct[i]), len(g.Trials[i]), len(g.Depths))
		}
		for j := range g.Depths {
			if c, n := g.Correct[i][j], g.Trials[i][j]; c < 0 || n < 0 || c > n {
				return fmt.Errorf("length %d, depth %g: %d correct of %d trials, want 0 ≤ correct ≤ trials", g.Lengths[i], g.Depths[j], c, n)
			}
		}
	}
	return nil
}

// checkPositions reports the first inconsistency of the series, naming the series and the
// bucket.
func checkPositions(series []PositionSeries) error {
	if len(series) == 0 {
		return errors.New("no series")
	}
	for k, s := range series {
		if err := checkSeries(s); err != nil {
			return fmt.Errorf("series %d (%q): %w", k, s.Name, err)
		}
	}
	return nil
}

// checkSeries reports the first inconsistency of s.
func checkSeries(s PositionSeries) error {
	n := len(s.Lo)
	if n == 0 || len(s.Hi) != n || len(s.Loss) != n || len(s.Tokens) != n {
		return fmt.Errorf("%d Lo, %d Hi, %d Loss and %d Tokens, want the same number of buckets (at least one)",
			len(s.Lo), len(s.Hi), len(s.Loss), len(s.Tokens))
	}
	if s.TrainLen < 0 {
		return fmt.Errorf("TrainLen = %d, want ≥ 0", s.TrainLen)
	}
	for i := range n {
		lo, hi := s.Lo[i], s.Hi[i]
		switch {
		case lo < 0 || hi <= lo:
			return fmt.Errorf("bucket %d is [%d, %d), want 0 ≤ lo < hi", i, lo, hi)
		case i > 0 && lo < s.Hi[i-1]:
			return fmt.Errorf("bucket %d [%d, %d) starts before bucket %d ends (%d), want ascending buckets", i, lo, hi, i-1, s.Hi[i-1])
		case s.Tokens[i] < 0:
			return fmt.Errorf("bucket %d [%d, %d): %d tokens, want ≥ 0", i, lo, hi, s.Tokens[i])
		case math.IsInf(s.Loss[i], 0) || s.Loss[i] < 0:
			return fmt.Errorf("bucket %d [%d, %d): loss %g, want finite and ≥ 0 (NaN when empty)", i, lo, hi, s.Loss[i])
		case s.Tokens[i] == 0 && !math.IsNaN(s.Loss[i]):
			return fmt.Errorf("bucket %d [%d, %d): loss %g of no tokens, want NaN", i, lo, hi, s.Loss[i])
		}
	}
	return nil
}

// lengthName writes a token count as 8K, 512K or 1M when it is a whole multiple of 1024 or
// 1024², else as the number (as plan's seqName does).
func lengthName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

// depthName writes a depth in [0,1] as a percentage with at most 3 significant digits: 10%,
// 12.5%.
func depthName(d float64) string {
	return strconv.FormatFloat(roundSig(100*d, 3), 'f', -1, 64) + "%"
}

// viridis is matplotlib's viridis colour map sampled at 0, 1/8, …, 1: lightness rises
// steadily from dark purple to yellow.
var viridis = []color.RGBA{
	{0x44, 0x01, 0x54, 0xff},
	{0x47, 0x2d, 0x7b, 0xff},
	{0x3b, 0x52, 0x8b, 0xff},
	{0x2c, 0x72, 0x8e, 0xff},
	{0x21, 0x90, 0x8c, 0xff},
	{0x27, 0xad, 0x81, 0xff},
	{0x5d, 0xc8, 0x63, 0xff},
	{0xaa, 0xdc, 0x32, 0xff},
	{0xfd, 0xe7, 0x25, 0xff},
}

// noTrialsColor fills a cell without trials.
var noTrialsColor = color.RGBA{0xd4, 0xd4, 0xd4, 0xff}

// heatColor is accuracy a's colour, a clamped to [0, 1]: viridis interpolated linearly.
func heatColor(a float64) color.RGBA {
	if !(a > 0) {
		return viridis[0]
	}
	if a >= 1 {
		return viridis[len(viridis)-1]
	}
	f := a * float64(len(viridis)-1)
	k := int(f)
	f -= float64(k)
	c0, c1 := viridis[k], viridis[k+1]
	mix := func(x, y uint8) uint8 { return uint8(math.Round(float64(x) + f*(float64(y)-float64(x)))) }
	return color.RGBA{mix(c0.R, c1.R), mix(c0.G, c1.G), mix(c0.B, c1.B), 0xff}
}

// luminance is c's relative luminance (WCAG): 0 for black, 1 for white.
func luminance(c color.RGBA) float64 {
	lin := func(v uint8) float64 {
		s := float64(v) / 255
		if s <= 0.04045 {
			return s / 12.92
		}
		return math.Pow((s+0.055)/1.055, 2.4)
	}
	return 0.2126*lin(c.R) + 0.7152*lin(c.G) + 0.0722*lin(c.B)
}

// inkOn is the text colour of more contrast on background c: black or white.
func inkOn(c color.RGBA) color.Color {
	l := luminance(c)
	if (l+0.05)/0.05 >= 1.05/(l+0.05) {
		return color.Black
	}
	return color.White
}

// newCanvas is a canvas of w × h for format, "png" (100 dpi) or "svg", with a white
// background (SVG is transparent otherwise, unreadable on a dark viewer).
func newCanvas(format string, w, h vg.Length) (vg.CanvasWriterTo, draw.Canvas, error) {
	var c vg.CanvasWriterTo
	switch format {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(plotDPI))}
	case "svg":
		c = vgsvg.New(w, h)
	default:
		return nil, draw.Canvas{}, fmt.Errorf("unknown picture format %q", format)
	}
	dc := draw.New(c)
	dc.FillPolygon(color.White, []vg.Point{dc.Min, {X: dc.Max.X, Y: dc.Min.Y}, dc.Max, {X: dc.Min.X, Y: dc.Max.Y}})
	return c, dc, nil
}

// drawHeading writes title in bold centred at the top of c, cut with "…" when too wide.
func drawHeading(c draw.Canvas, title string) {
	sty := textStyle(16, color.Black)
	sty.Font.Weight = xfont.WeightBold
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	title = fitText(sty, title, c.Max.X-c.Min.X-vg.Points(20))
	c.FillText(sty, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: c.Max.Y - vg.Points(10)}, title)
}

// The passkey picture's layout: each panel at least passkeyPanelW × passkeyPanelH, wider or
// taller by passkeyCellW or passkeyCellH per column or row beyond the fourth or fifth; the
// title above and the colour bar on the right.
const (
	passkeyPanelW = 4.8 * vg.Inch
	passkeyPanelH = 4.4 * vg.Inch
	passkeyCellW  = 0.62 * vg.Inch
	passkeyCellH  = 0.34 * vg.Inch
	passkeyTop    = 58  // points above the panels: title and panel titles
	passkeyBarW   = 100 // points right of the panels: the colour bar and its labels
)

// passkeySize is the size of the picture of grids.
func passkeySize(grids []PasskeyGrid) (w, h vg.Length) {
	pw, ph := passkeyPanelW, passkeyPanelH
	for _, g := range grids {
		pw = max(pw, passkeyCellW*vg.Length(len(g.Lengths))+1.3*vg.Inch)
		ph = max(ph, passkeyCellH*vg.Length(len(g.Depths))+1.6*vg.Inch)
	}
	return pw*vg.Length(len(grids)) + passkeyBarW, ph + passkeyTop
}

// drawPasskey draws the grids, checked, into w as format.
func drawPasskey(w io.Writer, title string, grids []PasskeyGrid, format string) error {
	width, height := passkeySize(grids)
	c, dc, err := newCanvas(format, width, height)
	if err != nil {
		return err
	}
	row := make([]*plot.Plot, len(grids))
	empty := false
	for k, g := range grids {
		row[k] = passkeyPanel(g)
		for _, ts := range g.Trials {
			for _, n := range ts {
				empty = empty || n == 0
			}
		}
	}
	panels := draw.Crop(dc, 0, -passkeyBarW, 0, 0)
	tiles := draw.Tiles{Rows: 1, Cols: len(grids), PadX: vg.Points(24),
		PadTop: passkeyTop, PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(4)}
	canvases := alignPanels([][]*plot.Plot{row}, tiles, panels)
	for k, p := range row {
		p.Draw(canvases[0][k])
		d := p.DataCanvas(canvases[0][k])
		sty := textStyle(13, color.Black)
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YBottom
		tile := canvases[0][k]
		tile.FillText(sty, vg.Point{X: (d.Min.X + d.Max.X) / 2, Y: d.Max.Y + vg.Points(8)},
			fitText(sty, passkeyTitle(grids[k]), tile.Max.X-tile.Min.X))
	}
	d := row[0].DataCanvas(canvases[0][0])
	bar := dc
	bar.Min.X, bar.Max.X = dc.Max.X-passkeyBarW+vg.Points(14), dc.Max.X
	bar.Min.Y, bar.Max.Y = d.Min.Y, d.Max.Y
	drawColorBar(bar, empty)
	drawHeading(dc, title)
	_, err = c.WriteTo(w)
	return err
}

// passkeyTitle is a panel's title: the scoring and its overall accuracy.
func passkeyTitle(g PasskeyGrid) string {
	correct, trials := 0, 0
	for i := range g.Trials {
		for j := range g.Trials[i] {
			correct += g.Correct[i][j]
			trials += g.Trials[i][j]
		}
	}
	s := "no trials"
	if trials > 0 {
		s = fmt.Sprintf("accuracy %.2f (%d/%d)", float64(correct)/float64(trials), correct, trials)
	}
	if g.Title != "" {
		s = g.Title + ": " + s
	}
	return s
}

// passkeyPanel is g's heat map: one column per length, one row per depth (the first at the
// top), no padding between the cells and the axes.
func passkeyPanel(g PasskeyGrid) *plot.Plot {
	p := plot.New()
	p.X.Label.Text = "context length (tokens)"
	p.Y.Label.Text = "depth of the key (0% = start of the filler)"
	p.X.Label.TextStyle.Font = plotFont(11)
	p.Y.Label.TextStyle.Font = plotFont(11)
	p.X.Tick.Label.Font = plotFont(10)
	p.Y.Tick.Label.Font = plotFont(10)
	p.X.Padding, p.Y.Padding = 0, 0
	var xt, yt plot.ConstantTicks
	for i, n := range g.Lengths {
		xt = append(xt, plot.Tick{Value: float64(i), Label: lengthName(n)})
	}
	for j, d := range g.Depths {
		yt = append(yt, plot.Tick{Value: float64(len(g.Depths) - 1 - j), Label: depthName(d)})
	}
	p.X.Tick.Marker, p.Y.Tick.Marker = xt, yt
	p.Add(heatCells{g})
	return p
}

// heatCells is a passkey grid's cells as a plotter: column i centred at x = i, depth row j
// at y = len(Depths)-1-j.
type heatCells struct{ g PasskeyGrid }

// DataRange implements plot.DataRanger: the cells' edges.
func (h heatCells) DataRange() (xmin, xmax, ymin, ymax float64) {
	return -0.5, float64(len(h.g.Lengths)) - 0.5, -0.5, float64(len(h.g.Depths)) - 0.5
}

// Plot implements plot.Plotter: each cell filled with its accuracy's colour (grey without
// trials), a white gap between cells, and the accuracy written in it when it fits, with
// "correct/trials" below when that fits too.
func (h heatCells) Plot(c draw.Canvas, p *plot.Plot) {
	x, y := p.Transforms(&c)
	gap := vg.Points(0.75)
	cw, ch := x(1)-x(0), y(1)-y(0)
	// The accuracy's font: at most 12 points, "0.00" within 80% of the cell's width, two lines
	// within 70% of its height; none below 6 points.
	acc := textStyle(12, color.Black)
	acc.Font.Size = min(12, 0.8*cw/(acc.Width("0.00")/12), 0.35*ch)
	acc.Font.Weight = xfont.WeightBold
	acc.XAlign, acc.YAlign = draw.XCenter, draw.YCenter
	frac := acc
	frac.Font.Weight = xfont.WeightNormal
	frac.Font.Size = acc.Font.Size * 0.8
	widest := ""
	for i := range h.g.Trials {
		for j := range h.g.Trials[i] {
			if s := fmt.Sprintf("%d/%d", h.g.Correct[i][j], h.g.Trials[i][j]); len(s) > len(widest) {
				widest = s
			}
		}
	}
	withFrac := frac.Width(widest) <= 0.85*cw && 2.4*acc.Font.Size <= 0.8*ch
	for i := range h.g.Lengths {
		for j := range h.g.Depths {
			cx, cy := float64(i), float64(len(h.g.Depths)-1-j)
			x0, x1, y0, y1 := x(cx-0.5)+gap, x(cx+0.5)-gap, y(cy-0.5)+gap, y(cy+0.5)-gap
			n, k := h.g.Trials[i][j], h.g.Correct[i][j]
			fill := noTrialsColor
			if n > 0 {
				fill = heatColor(float64(k) / float64(n))
			}
			c.FillPolygon(fill, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
			if acc.Font.Size < 6 {
				continue
			}
			mid := vg.Point{X: (x0 + x1) / 2, Y: (y0 + y1) / 2}
			ink := inkOn(fill)
			a, f := acc, frac
			a.Color, f.Color = ink, ink
			if n == 0 {
				a.Color = color.Gray{0x60}
				c.FillText(a, mid, "–")
				continue
			}
			if !withFrac {
				c.FillText(a, mid, fmt.Sprintf("%.2f", float64(k)/float64(n)))
				continue
			}
			c.FillText(a, vg.Point{X: mid.X, Y: mid.Y + 0.6*a.Font.Size}, fmt.Sprintf("%.2f", float64(k)/float64(n)))
			c.FillText(f, vg.Point{X: mid.X, Y: mid.Y - 0.65*a.Font.Size}, fmt.Sprintf("%d/%d", k, n))
		}
	}
}

// drawColorBar draws the accuracy scale in c: "accuracy" above a vertical ramp from 0
// (bottom) to 1 (top) spanning c's height, labelled every 0.25 on its right, and when empty,
// a grey swatch "no trials" under it.
func drawColorBar(c draw.Canvas, empty bool) {
	const strips = 100
	barW := vg.Points(14)
	x0, x1 := c.Min.X, c.Min.X+barW
	h := c.Max.Y - c.Min.Y
	for s := range strips {
		ya := c.Min.Y + h*vg.Length(s)/strips
		yb := c.Min.Y + h*vg.Length(s+1)/strips
		if s < strips-1 {
			yb += vg.Points(1.5) // under the next strip: no antialiased seams between strips
		}
		c.FillPolygon(heatColor((float64(s)+0.5)/strips), []vg.Point{{X: x0, Y: ya}, {X: x1, Y: ya}, {X: x1, Y: yb}, {X: x0, Y: yb}})
	}
	edge := draw.LineStyle{Color: color.Gray{0x40}, Width: vg.Points(0.6)}
	c.StrokeLines(edge, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}, {X: x0, Y: c.Min.Y}})
	lab := textStyle(10, color.Black)
	lab.YAlign = draw.YCenter
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := c.Min.Y + h*vg.Length(v)
		c.StrokeLine2(edge, x1, y, x1+vg.Points(4), y)
		c.FillText(lab, vg.Point{X: x1 + vg.Points(6), Y: y}, strconv.FormatFloat(v, 'f', -1, 64))
	}
	head := textStyle(11, color.Black)
	head.YAlign = draw.YBottom
	c.FillText(head, vg.Point{X: x0, Y: c.Max.Y + vg.Points(8)}, "accuracy")
	if empty {
		y := c.Min.Y - vg.Points(30)
		c.FillPolygon(noTrialsColor, []vg.Point{{X: x0, Y: y}, {X: x1, Y: y}, {X: x1, Y: y + barW}, {X: x0, Y: y + barW}})
		note := textStyle(9, color.Black)
		note.YAlign = draw.YCenter
		c.FillText(note, vg.Point{X: x1 + vg.Points(6), Y: y + barW/2}, "no trials")
	}
}

// The loss-by-position picture: positionsW × positionsH, the legend in the right
// positionsLegendW.
const (
	positionsW       = 11 * vg.Inch
	positionsH       = 6 * vg.Inch
	positionsLegendW = 3.1 * vg.Inch
)

// positionGlyphs are the series' marker shapes, in turn, so that lines tell apart in grey too.
var positionGlyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}}

// bucketCentre is where bucket [lo, hi) is drawn: (lo+hi)/2.
func bucketCentre(lo, hi int) float64 { return (float64(lo) + float64(hi)) / 2 }

// drawPositions draws the series, checked, into w as format.
func drawPositions(w io.Writer, title string, series []PositionSeries, format string) error {
	c, dc, err := newCanvas(format, positionsW, positionsH)
	if err != nil {
		return err
	}
	p := newPanel("token position (log scale)", "loss (nats/token)")
	p.X.Tick.Marker = log2Ticks{}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	anyLoss := false
	for k, s := range series {
		sty := runStyle(k)
		xmin = min(xmin, math.Log2(bucketCentre(s.Lo[0], s.Hi[0])))
		xmax = max(xmax, math.Log2(bucketCentre(s.Lo[len(s.Lo)-1], s.Hi[len(s.Hi)-1])))
		var seg, pts plotter.XYs
		for i := range s.Lo {
			if math.IsNaN(s.Loss[i]) {
				if err := addSegment(p, seg, sty); err != nil {
					return err
				}
				seg = nil
				continue
			}
			xy := plotter.XY{X: math.Log2(bucketCentre(s.Lo[i], s.Hi[i])), Y: s.Loss[i]}
			seg, pts = append(seg, xy), append(pts, xy)
		}
		if err := addSegment(p, seg, sty); err != nil {
			return err
		}
		if len(pts) > 0 {
			anyLoss = true
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return err
			}
			sc.GlyphStyle = seriesGlyph(k)
			p.Add(sc)
		}
		if s.TrainLen > 0 {
			p.Add(vLine{x: math.Log2(float64(s.TrainLen)), sty: sty})
		}
	}
	// The x axis spans every bucket, empty or not, and the training lengths, with a fifth of
	// an octave to spare at each end so that a training length there shows off the axis; a
	// range of one point is widened to an octave.
	p.X.Min, p.X.Max = min(p.X.Min, xmin)-0.2, max(p.X.Max, xmax)+0.2
	if p.X.Max-p.X.Min < 1 {
		m := (p.X.Min + p.X.Max) / 2
		p.X.Min, p.X.Max = m-0.5, m+0.5
	}
	if !anyLoss {
		p.Y.Min, p.Y.Max = 0, 1
	} else if p.Y.Min == p.Y.Max {
		p.Y.Min, p.Y.Max = p.Y.Min-0.5, p.Y.Max+0.5
	}
	padY(p)

	panel := draw.Crop(dc, vg.Points(10), -positionsLegendW, vg.Points(10), -vg.Points(48))
	p.Draw(panel)
	legend := dc
	legend.Min.X = dc.Max.X - positionsLegendW + vg.Points(10)
	legend.Max.Y = p.DataCanvas(panel).Max.Y
	drawPositionLegend(legend, series)
	drawHeading(dc, title)
	_, err = c.WriteTo(w)
	return err
}

// seriesGlyph is series k's marker: its colour and shape.
func seriesGlyph(k int) draw.GlyphStyle {
	return draw.GlyphStyle{Color: plotColors[k%len(plotColors)], Radius: vg.Points(3.5), Shape: positionGlyphs[k%len(positionGlyphs)]}
}

// addSegment adds a series' line through consecutive non-empty buckets to p (none for fewer
// than two).
func addSegment(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle) error {
	if len(xys) < 2 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.LineStyle = sty
	p.Add(l)
	return nil
}

// drawPositionLegend fills the legend of the loss-by-position picture in c: per series its
// line and marker, its name and a summary (training length, tokens), then what the marks
// mean; text too wide is cut with "…".
func drawPositionLegend(c draw.Canvas, series []PositionSeries) {
	x0 := c.Min.X + vg.Points(8)
	textX := x0 + vg.Points(34)
	head := textStyle(13, color.Black)
	head.YAlign = draw.YTop
	c.FillText(head, vg.Point{X: x0, Y: c.Max.Y}, "Models")

	note := textStyle(9.5, color.Gray{0x40})
	note.YAlign = draw.YCenter
	keys := []string{"markers: mean loss of the positions [lo, hi)", "drawn at the bucket's centre (lo+hi)/2"}
	for _, s := range series {
		if s.TrainLen > 0 {
			keys = append(keys, "dashed vertical line: the training length")
			break
		}
	}
	const keyStep = vg.Length(13)
	y := c.Min.Y + vg.Points(10) + keyStep*vg.Length(len(keys)-1)
	for _, k := range keys {
		c.FillText(note, vg.Point{X: x0, Y: y}, fitText(note, k, c.Max.X-x0-vg.Points(4)))
		y -= keyStep
	}

	top := c.Max.Y - vg.Points(32)
	avail := top - (c.Min.Y + vg.Points(10) + keyStep*vg.Length(len(keys)+1))
	step := min(vg.Points(17), avail/vg.Length(2*len(series)))
	twoLines := step >= vg.Points(11)
	if !twoLines {
		step = min(vg.Points(17), avail/vg.Length(len(series)))
	}
	name := textStyle(min(12, max(6, step*0.75)), color.Black)
	name.YAlign = draw.YCenter
	y = top
	for k, s := range series {
		sty := runStyle(k)
		c.StrokeLine2(sty, x0, y, x0+vg.Points(26), y)
		g := seriesGlyph(k)
		g.Radius = min(g.Radius, step/3)
		c.DrawGlyph(g, vg.Point{X: x0 + vg.Points(13), Y: y})
		c.FillText(name, vg.Point{X: textX, Y: y}, fitText(name, s.Name, c.Max.X-textX-vg.Points(4)))
		y -= step
		if twoLines {
			c.FillText(note, vg.Point{X: textX, Y: y}, fitText(note, positionSummary(s), c.Max.X-textX-vg.Points(4)))
			y -= step
		}
	}
}

// positionSummary is a series' line under its name in the legend: its training length and
// the tokens counted.
func positionSummary(s PositionSeries) string {
	var tokens int64
	for _, n := range s.Tokens {
		tokens += n
	}
	out := formatSI(float64(tokens)) + " tokens"
	if s.TrainLen > 0 {
		out = "trained at " + lengthName(s.TrainLen) + ",  " + out
	}
	return out
}

// log2Ticks marks an axis of log2 values at the powers of two, labelled with lengthName (64,
// 1K); with more than ten in range every other power is labelled (the even ones), the rest
// minor ticks.
type log2Ticks struct{}

// Ticks implements plot.Ticker; min and max are log2 of the range.
func (log2Ticks) Ticks(lmin, lmax float64) []plot.Tick {
	lo, hi := int(math.Ceil(lmin-1e-9)), int(math.Floor(lmax+1e-9))
	every := 1
	if hi-lo+1 > 10 {
		every = 2
	}
	var ts []plot.Tick
	for k := max(lo, 0); k <= hi && k < 62; k++ {
		t := plot.Tick{Value: float64(k)}
		if k%every == 0 {
			t.Label = lengthName(1 << k)
		}
		ts = append(ts, t)
	}
	return ts
}
