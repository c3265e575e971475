package runplot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	xfont "golang.org/x/image/font"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The picture of `distflash plot`: a title line, then five panels and a legend in a 3×2 grid:
//
//	loss against step        | loss against tokens
//	learning rate            | gradient norm (log scale)
//	tokens/s                 | legend: one line per run with its summary
//
// Every run has its colour in every panel; eval loss is drawn in the run's colour as a dashed
// line with circles; a diverged run has a dashed vertical line at the step it diverged and
// says so in the title and the legend.

// Picture size: 12 × 10.5 inches, 1200 × 1050 pixels as PNG.
const (
	plotWidth  = 12 * vg.Inch
	plotHeight = 10.5 * vg.Inch
	plotDPI    = 100
)

// plotColors are the Okabe–Ito colours (distinguishable with colour blindness) with their
// yellow, too pale on white, replaced by Tol's wine; black last.
var plotColors = []color.RGBA{
	{0x00, 0x72, 0xB2, 0xff}, // blue
	{0xD5, 0x5E, 0x00, 0xff}, // vermillion
	{0x00, 0x9E, 0x73, 0xff}, // bluish green
	{0xCC, 0x79, 0xA7, 0xff}, // reddish purple
	{0xE6, 0x9F, 0x00, 0xff}, // orange
	{0x56, 0xB4, 0xE9, 0xff}, // sky blue
	{0x88, 0x22, 0x55, 0xff}, // wine
	{0x00, 0x00, 0x00, 0xff}, // black
}

// runStyle is run i's line: its colour, dashed from the ninth run on (the colours repeat).
func runStyle(i int) draw.LineStyle {
	s := draw.LineStyle{Color: plotColors[i%len(plotColors)], Width: vg.Points(1.4)}
	if i >= len(plotColors) {
		s.Dashes = []vg.Length{vg.Points(6), vg.Points(2)}
	}
	return s
}

// Draw draws the runs overlaid into w as format, "png" (1200 × 1050 pixels) or "svg" (12 ×
// 10.5 inches).
func Draw(w io.Writer, runs []*Run, format string) error {
	var c vg.CanvasWriterTo
	switch format {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))}
	case "svg":
		c = vgsvg.New(plotWidth, plotHeight)
	default:
		return fmt.Errorf("unknown picture format %q", format)
	}
	dc := draw.New(c)
	// An opaque background: SVG is transparent otherwise, unreadable on a dark viewer.
	dc.FillPolygon(color.White, []vg.Point{dc.Min, {X: dc.Max.X, Y: dc.Min.Y}, dc.Max, {X: dc.Min.X, Y: dc.Max.Y}})

	lossStep := newPanel("step", "loss (nats/token)")
	lossTokens := newPanel("tokens", "loss (nats/token)")
	lr := newPanel("step", "learning rate")
	gradNorm := newPanel("step", "global L2 norm (log scale)")
	speed := newPanel("step", "tokens/s")
	speed.Y.Tick.Marker = niceTicks{si: true}
	grid := [][]*plot.Plot{{lossStep, lossTokens}, {lr, gradNorm}, {speed, nil}}
	titles := [][]string{{"Training loss", "Training loss against tokens seen"},
		{"Learning rate", "Gradient norm (before clipping)"}, {"Throughput", ""}}

	win := smoothWindow(runs)
	for i, r := range runs {
		sty := runStyle(i)
		var loss, lossTok, eval, evalTok, lrs, norms, tps plotter.XYs
		for _, p := range r.Points {
			x := float64(p.Step)
			loss = appendFinite(loss, x, p.Loss)
			lossTok = appendFinite(lossTok, p.Tokens, p.Loss)
			eval = appendFinite(eval, x, p.EvalLoss)
			evalTok = appendFinite(evalTok, p.Tokens, p.EvalLoss)
			lrs = appendFinite(lrs, x, p.LR)
			if p.GradNorm > 0 {
				norms = appendFinite(norms, x, math.Log10(p.GradNorm))
			}
			tps = appendFinite(tps, x, p.TokensPerSec)
		}
		if err := addLine(lr, lrs, sty); err != nil {
			return err
		}
		for _, a := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{lossStep, loss}, {lossTokens, lossTok}, {gradNorm, norms}, {speed, tps}} {
			if err := addNoisy(a.p, a.xys, sty, win); err != nil {
				return err
			}
		}
		for _, a := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{lossStep, eval}, {lossTokens, evalTok}} {
			if err := addEval(a.p, a.xys, sty); err != nil {
				return err
			}
		}
		if r.DivergedAt > 0 {
			for _, p := range []*plot.Plot{lossStep, lr, gradNorm, speed} {
				p.Add(vLine{x: float64(r.DivergedAt), sty: sty})
			}
			for _, p := range r.Points {
				if p.Step == r.DivergedAt && !math.IsNaN(p.Tokens) {
					lossTokens.Add(vLine{x: p.Tokens, sty: sty})
				}
			}
		}
	}
	for i, p := range []*plot.Plot{lossStep, lossTokens} {
		if clipLossAxis(p, runs) {
			titles[0][i] += " (clipped at the top)"
		}
	}
	for _, p := range []*plot.Plot{lossStep, lossTokens, lr, gradNorm, speed} {
		if p.X.Min > 0 {
			p.X.Min = 0 // steps and tokens count from 0
		}
	}
	fromZero(lr)
	fromZero(speed)
	logAxis(gradNorm)
	for _, p := range []*plot.Plot{lossStep, lossTokens, lr, gradNorm, speed} {
		padY(p)
	}

	tiles := draw.Tiles{Rows: 3, Cols: 2, PadX: vg.Points(28), PadY: vg.Points(34),
		PadTop: vg.Points(66), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(18)}
	canvases := alignPanels(grid, tiles, dc)
	for j, row := range grid {
		for i, p := range row {
			if p != nil {
				p.Draw(canvases[j][i])
				drawPanelTitle(canvases[j][i], p, titles[j][i])
			}
		}
	}
	drawTitle(dc, runs)
	drawLegend(canvases[2][1], runs, win)
	_, err := c.WriteTo(w)
	return err
}

// newPanel is an empty panel with axis labels and a grid. Its title is drawn by
// drawPanelTitle, above the data area, so that titles line up whatever the axes' tick labels.
func newPanel(x, y string) *plot.Plot {
	p := plot.New()
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.X.Label.TextStyle.Font = plotFont(11)
	p.Y.Label.TextStyle.Font = plotFont(11)
	p.X.Tick.Label.Font = plotFont(10)
	p.Y.Tick.Label.Font = plotFont(10)
	p.X.Tick.Marker = niceTicks{si: true}
	p.Y.Tick.Marker = niceTicks{}
	g := plotter.NewGrid()
	g.Vertical.Color = color.Gray{0xe0}
	g.Horizontal.Color = color.Gray{0xe0}
	p.Add(g)
	return p
}

// appendFinite appends (x, y) when both are finite.
func appendFinite(xys plotter.XYs, x, y float64) plotter.XYs {
	if math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(y) || math.IsInf(y, 0) {
		return xys
	}
	return append(xys, plotter.XY{X: x, Y: y})
}

// addLine adds a run's line to p; a single point is drawn as a dot, so that it shows. A long
// line is drawn from its envelope (see decimate).
func addLine(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle) error {
	xys = decimate(xys, lineBuckets)
	switch len(xys) {
	case 0:
		return nil
	case 1:
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		s.GlyphStyle = draw.GlyphStyle{Color: sty.Color, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
		p.Add(s)
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

// lineBuckets is the number of pieces a long line is cut into for drawing: about twice the
// pixels across a panel.
const lineBuckets = 1000

// decimate returns xys when it has at most 2·buckets points, else its envelope: its first
// and last point and, of each of buckets runs of consecutive points, the lowest and the
// highest (in their order), so a panel shows every spike of a long run while drawing at most
// 2·buckets+2 points (a 100k-step PNG takes a minute otherwise).
func decimate(xys plotter.XYs, buckets int) plotter.XYs {
	if len(xys) <= 2*buckets {
		return xys
	}
	out := make(plotter.XYs, 0, 2*buckets+2)
	out = append(out, xys[0]) // the ends, so that the line spans the run
	for b := range buckets {
		lo, hi := b*len(xys)/buckets, (b+1)*len(xys)/buckets
		imin, imax := lo, lo
		for i := lo; i < hi; i++ {
			if xys[i].Y < xys[imin].Y {
				imin = i
			}
			if xys[i].Y > xys[imax].Y {
				imax = i
			}
		}
		for _, i := range []int{min(imin, imax), max(imin, imax)} {
			if i > 0 && i < len(xys)-1 && xys[i] != out[len(out)-1] {
				out = append(out, xys[i])
			}
		}
	}
	return append(out, xys[len(xys)-1])
}

// addNoisy adds a per-step series that is noisy (loss, gradient norm, tokens/s): with a
// window win > 1, each step faint and the moving average over win steps bold.
func addNoisy(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle, win int) error {
	if win <= 1 || len(xys) <= win {
		return addLine(p, xys, sty)
	}
	faint := sty
	r, g, b, _ := sty.Color.RGBA()
	faint.Color = color.NRGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 0x50}
	faint.Width = vg.Points(0.8)
	if err := addLine(p, xys, faint); err != nil {
		return err
	}
	return addLine(p, movingAverage(xys, win), sty)
}

// smoothWindow is the moving average's width for the runs: odd, about a twentieth of the
// longest run's steps; 1 (no smoothing) below 40 steps.
func smoothWindow(runs []*Run) int {
	n := 0
	for _, r := range runs {
		n = max(n, len(r.Points))
	}
	if n < 40 {
		return 1
	}
	return n/40*2 + 1
}

// movingAverage is the moving average of xys's Y over w points centred on each point. Near
// the start the window shrinks to stay centred, so the curve starts at the first value
// (training curves move fastest there); near the end it is cut, so the curve ends at the
// mean of the last points rather than at the last, noisy one. From prefix sums: O(len(xys)).
func movingAverage(xys plotter.XYs, w int) plotter.XYs {
	sum := make([]float64, len(xys)+1)
	for i, p := range xys {
		sum[i+1] = sum[i] + p.Y
	}
	out := make(plotter.XYs, len(xys))
	for i := range xys {
		h := min(w/2, i)
		lo, hi := i-h, min(len(xys)-1, i+h)
		out[i] = plotter.XY{X: xys[i].X, Y: (sum[hi+1] - sum[lo]) / float64(hi-lo+1)}
	}
	return out
}

// addEval adds a run's eval losses to p: circles joined by a dashed line.
func addEval(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle) error {
	if len(xys) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.LineStyle = sty
	l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	s.GlyphStyle = draw.GlyphStyle{Color: sty.Color, Radius: vg.Points(3.5), Shape: draw.CircleGlyph{}}
	p.Add(l, s)
	return nil
}

// vLine is a dashed vertical line across a panel at x: where a run diverged.
type vLine struct {
	x   float64
	sty draw.LineStyle
}

// Plot implements plot.Plotter.
func (v vLine) Plot(c draw.Canvas, p *plot.Plot) {
	x, _ := p.Transforms(&c)
	sty := v.sty
	sty.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	c.StrokeLine2(sty, x(v.x), c.Min.Y, x(v.x), c.Max.Y)
}

// DataRange implements plot.DataRanger: the line widens the x range to its step only.
func (v vLine) DataRange() (xmin, xmax, ymin, ymax float64) {
	return v.x, v.x, math.Inf(1), math.Inf(-1)
}

// clipLossAxis keeps the loss axis readable when a run blows up: the top is at most 1.5 times
// the highest first loss of the runs (a fresh model's loss, about ln vocab). It reports
// whether it clipped, for the title to say that higher values run off the panel.
func clipLossAxis(p *plot.Plot, runs []*Run) bool {
	first := math.Inf(-1)
	for _, r := range runs {
		for _, pt := range r.Points {
			if !math.IsNaN(pt.Loss) {
				first = math.Max(first, pt.Loss)
				break
			}
		}
	}
	if top := 1.5 * first; first > 0 && p.Y.Max > top {
		p.Y.Max = top
		return true
	}
	return false
}

// fromZero starts p's y axis at 0 (for quantities whose ratio matters: learning rate, speed).
func fromZero(p *plot.Plot) {
	if p.Y.Min > 0 {
		p.Y.Min = 0
	}
}

// padY widens p's y range by 4% at each end, so that points on the edge (a run's first loss,
// an eval circle) show whole; an axis from 0 stays at 0.
func padY(p *plot.Plot) {
	if !(p.Y.Max > p.Y.Min) || math.IsInf(p.Y.Max-p.Y.Min, 0) {
		return
	}
	d := 0.04 * (p.Y.Max - p.Y.Min)
	if p.Y.Min != 0 {
		p.Y.Min -= d
	}
	p.Y.Max += d
}

// logAxis labels p's y axis, whose data are log10 of the values, with the values: a log
// scale. (plot.LogScale places the centred axis label by the arithmetic mean of the range,
// which on a range of decades pushes it off the top and squeezes the panel.)
func logAxis(p *plot.Plot) {
	if math.IsInf(p.Y.Min, 0) || math.IsInf(p.Y.Max, 0) {
		return // no data
	}
	if p.Y.Min == p.Y.Max {
		p.Y.Min, p.Y.Max = p.Y.Min-0.3, p.Y.Max+0.3
	}
	p.Y.Tick.Marker = logTicks{}
}

// plotTitles are the candidate lines above the panels, longest first: the runs and which
// diverged; the runs counted and which diverged; the runs and the diverged counted.
func plotTitles(runs []*Run) []string {
	var names, diverged []string
	for _, r := range runs {
		names = append(names, r.Name)
		if r.DivergedAt > 0 {
			diverged = append(diverged, fmt.Sprintf("  —  %s DIVERGED at step %d", r.Name, r.DivergedAt))
		}
	}
	counted := fmt.Sprintf("distflash training: %d runs", len(runs))
	short := counted
	if len(diverged) > 0 {
		short += fmt.Sprintf("  —  %d DIVERGED", len(diverged))
	}
	return []string{"distflash training: " + strings.Join(names, ", ") + strings.Join(diverged, ""),
		counted + strings.Join(diverged, ""), short}
}

// plotFont is the picture's font, Liberation Sans (which gonum/plot embeds), at size points.
func plotFont(size vg.Length) font.Font {
	return font.Font{Typeface: "Liberation", Variant: "Sans", Size: size}
}

// textStyle is the picture's font at size points in colour c.
func textStyle(size vg.Length, c color.Color) draw.TextStyle {
	return draw.TextStyle{Color: c, Font: plotFont(size), Handler: plot.DefaultTextHandler}
}

// alignPanels returns the canvas of each panel of grid (row-major, nil for an empty tile)
// such that data areas line up: within a column the same left and right edges, within a row
// the same bottom and top, the room left for tick labels being the widest a column or row
// needs. (plot.Align does this too, but gives rows different heights and spacing when one
// panel's axis labels are wider.)
func alignPanels(grid [][]*plot.Plot, t draw.Tiles, dc draw.Canvas) [][]draw.Canvas {
	type margins struct{ l, r, b, t vg.Length }
	out := make([][]draw.Canvas, t.Rows)
	own := make([][]margins, t.Rows)
	colL, colR := make([]vg.Length, t.Cols), make([]vg.Length, t.Cols)
	rowB, rowT := make([]vg.Length, t.Rows), make([]vg.Length, t.Rows)
	for j := range t.Rows {
		out[j] = make([]draw.Canvas, t.Cols)
		own[j] = make([]margins, t.Cols)
		for i := range t.Cols {
			c := t.At(dc, i, j)
			out[j][i] = c
			if grid[j][i] == nil {
				continue
			}
			d := grid[j][i].DataCanvas(c)
			m := margins{d.Min.X - c.Min.X, c.Max.X - d.Max.X, d.Min.Y - c.Min.Y, c.Max.Y - d.Max.Y}
			own[j][i] = m
			colL[i], colR[i] = max(colL[i], m.l), max(colR[i], m.r)
			rowB[j], rowT[j] = max(rowB[j], m.b), max(rowT[j], m.t)
		}
	}
	for j := range t.Rows {
		for i := range t.Cols {
			if grid[j][i] == nil {
				continue
			}
			m := own[j][i]
			out[j][i] = draw.Crop(out[j][i], colL[i]-m.l, m.r-colR[i], rowB[j]-m.b, m.t-rowT[j])
		}
	}
	return out
}

// drawPanelTitle writes a panel's title centred above its data area.
func drawPanelTitle(c draw.Canvas, p *plot.Plot, title string) {
	d := p.DataCanvas(c)
	sty := textStyle(13, color.Black)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YBottom
	c.FillText(sty, vg.Point{X: (d.Min.X + d.Max.X) / 2, Y: d.Max.Y + vg.Points(12)}, title)
}

// drawTitle writes the title centred at the top of c: the longest of plotTitles that fits.
func drawTitle(c draw.Canvas, runs []*Run) {
	sty := textStyle(16, color.Black)
	sty.Font.Weight = xfont.WeightBold
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	ts := plotTitles(runs)
	title := ts[len(ts)-1]
	for _, t := range ts {
		if sty.Width(t) <= c.Max.X-c.Min.X-vg.Points(20) {
			title = t
			break
		}
	}
	c.FillText(sty, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: c.Max.Y - vg.Points(10)}, title)
}

// drawLegend fills the legend tile: per run a line in its colour, its name and a summary
// line, then what the line styles mean. With more runs than two lines each fit, each run
// gets one line (name, and whether it diverged), in a smaller font if need be; text wider
// than the tile is cut with "…".
func drawLegend(c draw.Canvas, runs []*Run, win int) {
	var keys []string
	anyEval, anyDiverged := false, false
	for _, r := range runs {
		anyDiverged = anyDiverged || r.DivergedAt > 0
		for _, p := range r.Points {
			anyEval = anyEval || !math.IsNaN(p.EvalLoss)
		}
	}
	if win > 1 {
		keys = append(keys, fmt.Sprintf("faint: every step;  bold: moving average over %d steps", win))
	}
	if anyEval {
		keys = append(keys, "solid: training loss;  dashed with circles: eval loss (data.eval)")
	}
	if anyDiverged {
		keys = append(keys, "dashed vertical line: the step where a run diverged")
	}
	keys = append(keys, fmt.Sprintf("loss a → b (last %d): the first step's, and the mean of the last %d steps'", LastSteps, LastSteps))
	const keyStep = vg.Length(14)
	note := textStyle(10, color.Gray{0x40})
	note.YAlign = draw.YCenter
	x0 := c.Min.X + vg.Points(14)
	maxW := c.Max.X - x0 - vg.Points(4)
	y := c.Min.Y + keyStep*vg.Length(len(keys))
	for _, k := range keys {
		c.FillText(note, vg.Point{X: x0, Y: y}, fitText(note, k, maxW))
		y -= keyStep
	}

	head := textStyle(13, color.Black)
	head.YAlign = draw.YCenter
	y = c.Max.Y - vg.Points(24)
	c.FillText(head, vg.Point{X: x0, Y: y}, "Runs")
	y -= vg.Points(22)
	if len(runs) == 0 {
		return
	}
	avail := y - (c.Min.Y + keyStep*vg.Length(len(keys)+1))
	n := vg.Length(len(runs))
	twoLines := 2*n*vg.Points(15) <= avail
	step := min(vg.Points(17), avail/n)
	if twoLines {
		step = min(vg.Points(17), avail/(2*n))
	}
	name := textStyle(min(12, max(6, step*0.75)), color.Black)
	name.YAlign = draw.YCenter
	textX := x0 + vg.Points(34)
	for i, r := range runs {
		sty := runStyle(i)
		sty.Width = min(vg.Points(3), step/3)
		c.StrokeLine2(sty, x0, y, x0+vg.Points(26), y)
		label := r.Name
		if r.DivergedAt > 0 {
			label += fmt.Sprintf("   DIVERGED at step %d", r.DivergedAt)
			if twoLines {
				label += fmt.Sprintf(" (non-finite %s)", r.DivergedWhat)
			}
		}
		c.FillText(name, vg.Point{X: textX, Y: y}, fitText(name, label, c.Max.X-textX))
		y -= step
		if twoLines {
			c.FillText(note, vg.Point{X: textX, Y: y}, fitText(note, runSummary(r), c.Max.X-textX))
			y -= step
		}
	}
}

// fitText returns s, cut and ended with "…" when it is wider than w in sty.
func fitText(sty draw.TextStyle, s string, w vg.Length) string {
	if sty.Width(s) <= w {
		return s
	}
	rs := []rune(s)
	for len(rs) > 0 && sty.Width(string(rs)+"…") > w {
		rs = rs[:len(rs)-1]
	}
	return string(rs) + "…"
}

// LastSteps is how many of a run's last steps its final loss is the mean of, in the legend
// and at the end of train: one step's loss is noisy.
const LastSteps = 10

// runSummary is the run's line under its name: steps, tokens, the first loss and the mean of
// the last LastSteps, the last eval loss, fp16 skips.
func runSummary(r *Run) string {
	first, last := r.Points[0], r.Points[len(r.Points)-1]
	parts := []string{fmt.Sprintf("steps %d–%d", first.Step, last.Step)}
	if first.Step == last.Step {
		parts[0] = fmt.Sprintf("step %d", first.Step)
	}
	if !math.IsNaN(last.Tokens) {
		parts = append(parts, formatSI(last.Tokens)+" tokens")
	}
	var losses []float64
	for _, p := range r.Points {
		if !math.IsNaN(p.Loss) {
			losses = append(losses, p.Loss)
		}
	}
	if n := len(losses); n > 0 {
		// one step's loss is noisy: the end is the mean of the last LastSteps
		k := min(n, LastSteps)
		sum := 0.0
		for _, l := range losses[n-k:] {
			sum += l
		}
		if k > 1 {
			parts = append(parts, fmt.Sprintf("loss %.3f → %.3f (last %d)", losses[0], sum/float64(k), k))
		} else {
			parts = append(parts, fmt.Sprintf("loss %.3f → %.3f", losses[0], sum))
		}
	}
	for i := len(r.Points) - 1; i >= 0; i-- {
		if p := r.Points[i]; !math.IsNaN(p.EvalLoss) {
			parts = append(parts, fmt.Sprintf("eval %.3f at step %d", p.EvalLoss, p.Step))
			break
		}
	}
	if r.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d fp16 steps skipped", r.Skipped))
	}
	return strings.Join(parts, ",  ")
}

// niceTicks marks a linear axis every 1, 2 or 5 × 10^k, 3 to 6 labels over the range
// (plot's default ticks aim at 3, at steps such as 120), with an unlabelled tick halfway;
// si labels with SI prefixes (250k, 1.5M).
type niceTicks struct{ si bool }

// Ticks implements plot.Ticker.
func (n niceTicks) Ticks(min, max float64) []plot.Tick {
	step := niceStep((max - min) / 6)
	if !(step > 0) || math.IsInf(step, 0) {
		return nil
	}
	var ts []plot.Tick
	for i := math.Ceil(min/step*2 - 1e-9); i <= math.Floor(max/step*2+1e-9); i++ {
		v := i * step / 2
		t := plot.Tick{Value: v}
		if math.Mod(i, 2) == 0 {
			v = roundSig(v, 12) // 0.30000000000000004 → 0.3
			if n.si {
				t.Label = formatSI(v)
			} else {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
		}
		ts = append(ts, t)
	}
	return ts
}

// niceStep is the smallest of 1, 2, 5 × 10^k at least x.
func niceStep(x float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// formatSI writes v with an SI prefix and at most 3 significant digits: 61.4k, 2M.
func formatSI(v float64) string {
	a := math.Abs(v)
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if a >= u.div {
			return strconv.FormatFloat(roundSig(v/u.div, 3), 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(roundSig(v, 3), 'f', -1, 64)
}

// roundSig rounds v to n significant digits.
func roundSig(v float64, n int) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, float64(n)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

// logTicks marks an axis of log10 values: every 1–9 × 10^k, labelled with the value at 1, 2
// and 5 × 10^k when the axis spans at most two decades (else at 10^k only), so a narrow
// range still has labels.
type logTicks struct{}

// Ticks implements plot.Ticker; min and max are log10 of the range.
func (logTicks) Ticks(lmin, lmax float64) []plot.Tick {
	min, max := math.Pow(10, lmin), math.Pow(10, lmax)
	lo, hi := int(math.Floor(lmin)), int(math.Ceil(lmax))
	labelled := map[int]bool{1: true}
	if lmax-lmin <= 2 {
		labelled[2], labelled[5] = true, true
	}
	var ts []plot.Tick
	for k := lo; k <= hi; k++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow10(k)
			if v < min*(1-1e-9) || v > max*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: math.Log10(v)}
			if labelled[m] {
				t.Label = formatLog(m, k)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// formatLog writes m × 10^k plainly (0.005, 2000) for k in [-3, 3], else as 5e-4, 1e6.
func formatLog(m, k int) string {
	if k < -3 || k > 3 {
		return fmt.Sprintf("%de%d", m, k)
	}
	return strconv.FormatFloat(float64(m)*math.Pow10(k), 'f', -1, 64)
}
