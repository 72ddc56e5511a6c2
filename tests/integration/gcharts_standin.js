// Offline stand-in for Google Charts (https://www.gstatic.com/charts/loader.js), which
// torch-tb-profiler's page loads from the internet before it renders anything. The
// browser test has no internet, so it serves this file at that URL instead. It
// implements the calls the plugin makes (google.charts.load, DataTable,
// arrayToDataTable, the chart classes' draw/clearChart/selection, events) and draws
// every chart as a titled HTML table of its data, so the DOM and the screenshot show
// what each chart was given. Everything else on the page is the plugin's own code.
(function () {
  'use strict';
  function cellValue(c) {
    return c !== null && typeof c === 'object' && 'v' in c ? c.v : c;
  }
  function DataTable() {
    this.cols = [];
    this.rows = [];
  }
  DataTable.prototype.addColumn = function (spec, label) {
    if (typeof spec === 'string') spec = {type: spec, label: label || ''};
    this.cols.push(spec);
    return this.cols.length - 1;
  };
  DataTable.prototype.addRow = function (row) { this.rows.push(row || []); return this.rows.length - 1; };
  DataTable.prototype.addRows = function (rows) { var self = this; rows.forEach(function (r) { self.addRow(r); }); };
  DataTable.prototype.setProperty = function () {};
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getNumberOfColumns = function () { return this.cols.length; };
  DataTable.prototype.getValue = function (r, c) { return cellValue(this.rows[r][c]); };

  function arrayToDataTable(arr) {
    var t = new DataTable();
    (arr[0] || []).forEach(function (h) { t.addColumn(typeof h === 'object' ? h : {type: 'string', label: String(h)}); });
    t.addRows(arr.slice(1));
    return t;
  }

  var listeners = new Map();
  function fire(chart, name, arg) {
    ((listeners.get(chart) || {})[name] || []).forEach(function (fn) { fn(arg); });
  }

  function makeChart(kind) {
    function Chart(container) { this.container = container; this.selection = []; }
    Chart.prototype.draw = function (data, options) {
      var box = document.createElement('div');
      box.className = 'gcharts-standin';
      box.setAttribute('data-chart', kind);
      box.style.cssText = 'font:12px sans-serif;overflow:auto;max-height:' +
        ((options && typeof options.height === 'number') ? options.height : 300) + 'px';
      var title = document.createElement('div');
      title.style.fontWeight = 'bold';
      title.textContent = kind + (options && options.title ? ': ' + options.title : '');
      box.appendChild(title);
      var table = document.createElement('table');
      table.style.borderCollapse = 'collapse';
      var visible = data.cols.map(function (c) { return !c.role; });
      var head = document.createElement('tr');
      data.cols.forEach(function (c, i) {
        if (!visible[i]) return;
        var th = document.createElement('th');
        th.textContent = c.label || c.id || '';
        th.style.cssText = 'border:1px solid #ccc;padding:2px 6px;background:#eef';
        head.appendChild(th);
      });
      table.appendChild(head);
      data.rows.forEach(function (row) {
        var tr = document.createElement('tr');
        row.forEach(function (cell, i) {
          if (!visible[i]) return;
          var td = document.createElement('td');
          var v = cellValue(cell);
          td.textContent = v === null || v === undefined ? '' : String(v);
          td.style.cssText = 'border:1px solid #ccc;padding:2px 6px';
          tr.appendChild(td);
        });
        table.appendChild(tr);
      });
      box.appendChild(table);
      this.container.innerHTML = '';
      this.container.appendChild(box);
      var self = this;
      setTimeout(function () { fire(self, 'ready'); }, 0);
    };
    Chart.prototype.clearChart = function () { this.container.innerHTML = ''; };
    Chart.prototype.getSelection = function () { return this.selection; };
    Chart.prototype.setSelection = function (s) { this.selection = s || []; };
    Chart.prototype.getChartLayoutInterface = function () {
      return {
        getChartAreaBoundingBox: function () { return {left: 0, top: 0, width: 0, height: 0}; },
        getHAxisValue: function () { return 0; },
      };
    };
    return Chart;
  }

  var visualization = {
    DataTable: DataTable,
    arrayToDataTable: arrayToDataTable,
    events: {
      addListener: function (chart, name, fn) {
        var m = listeners.get(chart) || {};
        (m[name] = m[name] || []).push(fn);
        listeners.set(chart, m);
        return {chart: chart, name: name, fn: fn};
      },
      removeListener: function () {},
    },
  };
  ['ColumnChart', 'ComboChart', 'LineChart', 'PieChart', 'SteppedAreaChart', 'Table', 'Timeline']
    .forEach(function (kind) { visualization[kind] = makeChart(kind); });

  window.google = window.google || {};
  window.google.visualization = visualization;
  window.google.charts = {
    load: function () { return Promise.resolve(); },
    setOnLoadCallback: function (fn) { Promise.resolve().then(fn); },
  };
})();
