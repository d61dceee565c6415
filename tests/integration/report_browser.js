/* report_browser.js: checks of a `ballast report` page inside headless
 * Chromium (tests/integration/report_browser.sh appends it to the page with
 * window.REPORT_EXPECT set). Reads the rendered page, not its text: the
 * lines' bounding boxes, the value labels as drawn, the legends. Writes one
 * line per check, "PASS|name|" or "FAIL|name|detail", into a pre element
 * with the id report-checks. */
(function () {
    var out = [];
    function check(name, ok, detail) { out.push((ok ? "PASS" : "FAIL") + "|" + name + "|" + (ok ? "" : detail)); }
    try {
        var E = window.REPORT_EXPECT;
        var svgs = Array.prototype.slice.call(document.querySelectorAll("svg[data-plot]"));
        var ids = svgs.map(function (s) { return s.getAttribute("data-plot"); });
        check("the plots drawn are those with data: " + ids.join(", "),
              JSON.stringify(ids) === JSON.stringify(Object.keys(E.plots)), "expected " + Object.keys(E.plots).join(", "));

        var bad = [], nlines = 0;
        svgs.forEach(function (svg) {
            var id = svg.getAttribute("data-plot");
            (E.plots[id] || []).forEach(function (e) {
                var sel = 'polyline[data-series="' + e.series + '"][data-run="' + e.run + '"]';
                var pl = svg.querySelectorAll(sel);
                if (pl.length !== e.segments) bad.push(id + ": " + pl.length + " lines of " + e.series + " (run " + e.run + "), expected " + e.segments);
                Array.prototype.forEach.call(pl, function (p) {
                    nlines++;
                    var b = p.getBBox(), cs = getComputedStyle(p);
                    if (p.points.numberOfItems < 1) bad.push(id + "/" + e.series + ": a line without points");
                    if (b.x < 69.99 || b.x + b.width > 690.01 || b.y < 19.99 || b.y + b.height > 220.01)
                        bad.push(id + "/" + e.series + ": drawn outside the data area " + [b.x, b.y, b.width, b.height].join(","));
                    if (cs.fill !== "none" || cs.stroke === "none" || cs.visibility === "hidden") bad.push(id + "/" + e.series + ": not drawn as a line");
                });
            });
        });
        check("one line per series and run (" + nlines + "), inside the data area", bad.length === 0, bad.slice(0, 6).join("; "));

        bad = [];
        var nticks = 0;
        svgs.forEach(function (svg) {
            var id = svg.getAttribute("data-plot"), nonneg = svg.getAttribute("data-nonneg") === "1";
            var labs = Array.prototype.slice.call(svg.querySelectorAll("text.ylab"));
            var v = labs.map(function (t) { return parseFloat(t.textContent); });
            if (labs.length < 2) bad.push(id + ": " + labs.length + " value labels");
            for (var i = 0; i < labs.length; i++) {
                nticks++;
                var txt = labs[i].textContent, bb = labs[i].getBBox();
                if (!isFinite(v[i])) bad.push(id + ": label '" + txt + "' is not a number");
                if (nonneg && (v[i] < 0 || /^-/.test(txt))) bad.push(id + ": negative label '" + txt + "' on non-negative values");
                if (!(bb.width > 0)) bad.push(id + ": label '" + txt + "' not rendered");
                if (i > 0 && !(labs[i].getBBox().y < labs[i - 1].getBBox().y)) bad.push(id + ": labels not going up");
            }
            if (labs.length >= 2) {
                var d = v[1] - v[0], m = d / Math.pow(10, Math.floor(Math.log10(d) + 1e-9));
                if (!(Math.abs(m - 1) < 1e-6 || Math.abs(m - 2) < 1e-6 || Math.abs(m - 5) < 1e-6)) bad.push(id + ": tick step " + d);
                for (var k = 0; k < v.length; k++) {
                    var q = v[k] / d;
                    if (Math.abs(q - Math.round(q)) > 1e-6) bad.push(id + ": label " + labs[k].textContent + " not a multiple of " + d);
                    if (k > 0 && Math.abs(v[k] - v[k - 1] - d) > 1e-9 * Math.abs(d) + 1e-12) bad.push(id + ": uneven ticks " + v.join(" "));
                }
            }
        });
        check("round value labels (" + nticks + "), none negative on non-negative plots", bad.length === 0, bad.slice(0, 6).join("; "));

        bad = [];
        svgs.forEach(function (svg) {
            var id = svg.getAttribute("data-plot"), fig = svg.closest("figure");
            var runs = Array.prototype.map.call(fig.querySelectorAll(".legend span.run"), function (s) { return s.textContent; });
            if (JSON.stringify(runs) !== JSON.stringify(E.names)) bad.push(id + ": legend " + JSON.stringify(runs));
            Array.prototype.forEach.call(fig.querySelectorAll(".legend span.run"), function (s, r) {
                var sw = s.querySelector("i"), col = sw && getComputedStyle(sw).backgroundColor;
                var line = svg.querySelector('polyline[data-run="' + r + '"]');
                if (line && col !== getComputedStyle(line).stroke) bad.push(id + ": run " + r + " swatch " + col + ", line " + getComputedStyle(line).stroke);
            });
        });
        check("a legend entry per run in every plot, in the run's colour", bad.length === 0, bad.slice(0, 6).join("; "));

        var none = Array.prototype.map.call(document.querySelectorAll("p.none"), function (p) { return p.getAttribute("data-none"); });
        check("plots without data say so: " + none.join(", "), JSON.stringify(none) === JSON.stringify(E.none), "expected " + E.none.join(", "));
        var marks = document.querySelectorAll("line.resume");
        check("resumes marked in every plot (" + marks.length + ")", marks.length === E.resumes * svgs.length, "expected " + E.resumes * svgs.length);
    } catch (e) {
        out.push("FAIL|the checks ran|" + e);
    }
    check("no script error on the page", window.__report_errors.length === 0, window.__report_errors.join("; "));
    var pre = document.createElement("pre");
    pre.id = "report-checks";
    pre.textContent = out.join("\n");
    document.body.appendChild(pre);
})();
