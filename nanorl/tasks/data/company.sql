-- The built-in SQL task's database: a small company, written for nanorl.
CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL, department_id INTEGER REFERENCES departments(id),
                        salary INTEGER NOT NULL, hire_year INTEGER NOT NULL);
CREATE TABLE projects (id INTEGER PRIMARY KEY, name TEXT NOT NULL, department_id INTEGER REFERENCES departments(id),
                       budget INTEGER NOT NULL);
CREATE TABLE assignments (employee_id INTEGER REFERENCES employees(id), project_id INTEGER REFERENCES projects(id),
                          hours INTEGER NOT NULL);
INSERT INTO departments VALUES (1, 'Engineering', 'Berlin'), (2, 'Sales', 'Paris'), (3, 'Marketing', 'Paris'),
  (4, 'Finance', 'London'), (5, 'Support', 'Berlin');
INSERT INTO employees VALUES
  (1, 'Alice', 1, 95000, 2018), (2, 'Bob', 1, 85000, 2020), (3, 'Carla', 2, 60000, 2019), (4, 'Dan', 2, 58000, 2021),
  (5, 'Eve', 3, 70000, 2017), (6, 'Farid', 4, 99000, 2015), (7, 'Gina', 4, 72000, 2022), (8, 'Hugo', 5, 45000, 2023),
  (9, 'Ines', 1, 120000, 2012), (10, 'Jon', 5, 47000, 2021), (11, 'Kira', 3, 66000, 2020), (12, 'Luis', 1, 78000, 2022);
INSERT INTO projects VALUES (1, 'Compiler', 1, 500000), (2, 'Website', 3, 120000), (3, 'CRM', 2, 200000),
  (4, 'Audit', 4, 80000), (5, 'Helpdesk', 5, 60000), (6, 'Search', 1, 300000);
INSERT INTO assignments VALUES (1, 1, 120), (2, 1, 80), (9, 1, 40), (9, 6, 100), (12, 6, 60), (5, 2, 90), (11, 2, 30),
  (3, 3, 70), (4, 3, 50), (6, 4, 40), (7, 4, 60), (8, 5, 100), (10, 5, 20), (1, 6, 30);
